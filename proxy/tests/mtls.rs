//! The mesh hop's TLS with real certificates: SVIDs issued by a test root the way the
//! operator's certificate authority issues them (one SPIFFE URI SAN, both EKUs), handshakes
//! over real TCP, rotation of SVIDs and of the root.

use std::sync::Arc;

use aether_proxy::identity::ServiceAccount;
use aether_proxy::identity::tls::{Certs, TrustStore, peer_service_account};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const TD: &str = "cluster.local";

struct Root {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

fn root(name: &str) -> Root {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let cert = params.self_signed(&key).unwrap();
    Root {
        pem: cert.pem(),
        issuer: Issuer::new(params, key),
    }
}

/// An SVID for `sa` signed by `root`, or with a DNS name only when `spiffe` is false.
fn svid(
    root: &Root,
    sa: &ServiceAccount,
    spiffe: bool,
) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.subject_alt_names = vec![if spiffe {
        SanType::URI(sa.spiffe_id(TD).try_into().unwrap())
    } else {
        SanType::DnsName("web.example".try_into().unwrap())
    }];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let cert = params.signed_by(&key, &root.issuer).unwrap();
    (
        vec![cert.der().clone()],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    )
}

fn certs(bundle: &str) -> Arc<Certs> {
    let trust = TrustStore::new(TD);
    trust.set_bundle(bundle).unwrap();
    Certs::new(trust)
}

fn web() -> ServiceAccount {
    ServiceAccount::new("shop", "web")
}

fn echo() -> ServiceAccount {
    ServiceAccount::new("shop", "echo")
}

/// One handshake between `client` (as `client_sa`) and `server` (as `server_sa`), then a byte
/// each way. Returns what each side proved to the other, or the first error.
async fn handshake(
    client: &Certs,
    client_sa: &ServiceAccount,
    server: &Arc<Certs>,
    server_sa: &ServiceAccount,
) -> Result<(ServiceAccount, ServiceAccount), String> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(server.server_config(server_sa));
    let server_certs = server.clone();
    let accepted = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut tls = acceptor.accept(tcp).await.map_err(|e| e.to_string())?;
        let peer = peer_service_account(server_certs.trust(), tls.get_ref().1.peer_certificates());
        let mut byte = [0];
        tls.read_exact(&mut byte).await.map_err(|e| e.to_string())?;
        tls.write_all(&byte).await.map_err(|e| e.to_string())?;
        peer.ok_or_else(|| "no client identity".to_string())
    });
    let tcp = TcpStream::connect(addr).await.unwrap();
    let connector = tokio_rustls::TlsConnector::from(client.client_config(client_sa));
    let result = async {
        let mut tls = connector
            .connect(ServerName::IpAddress(addr.ip().into()), tcp)
            .await
            .map_err(|e| e.to_string())?;
        let peer = peer_service_account(client.trust(), tls.get_ref().1.peer_certificates())
            .ok_or("no server identity")?;
        tls.write_all(b"x").await.map_err(|e| e.to_string())?;
        let mut byte = [0];
        tls.read_exact(&mut byte).await.map_err(|e| e.to_string())?;
        Ok::<_, String>(peer)
    }
    .await;
    let server_saw = accepted.await.unwrap();
    Ok((server_saw?, result?))
}

#[tokio::test]
async fn both_sides_prove_their_service_accounts() {
    let ca = root("aether root");
    let (client, server) = (certs(&ca.pem), certs(&ca.pem));
    let (chain, key) = svid(&ca, &web(), true);
    client.install(&web(), chain, key).unwrap();
    let (chain, key) = svid(&ca, &echo(), true);
    server.install(&echo(), chain, key).unwrap();
    assert!(client.has(&web()) && !client.has(&echo()));

    let (client_is, server_is) = handshake(&client, &web(), &server, &echo()).await.unwrap();
    assert_eq!((client_is, server_is), (web(), echo()));
}

#[tokio::test]
async fn certificates_of_another_root_or_without_a_spiffe_id_are_refused() {
    let ca = root("aether root");
    let rogue = root("rogue root");
    let server = certs(&ca.pem);
    let (chain, key) = svid(&ca, &echo(), true);
    server.install(&echo(), chain, key).unwrap();

    // A client whose SVID another root signed.
    let client = certs(&ca.pem);
    let (chain, key) = svid(&rogue, &web(), true);
    client.install(&web(), chain, key).unwrap();
    assert!(handshake(&client, &web(), &server, &echo()).await.is_err());

    // A client with a certificate of the right root but no SPIFFE ID.
    let (chain, key) = svid(&ca, &web(), false);
    client.install(&web(), chain, key).unwrap();
    assert!(handshake(&client, &web(), &server, &echo()).await.is_err());

    // A client that does not trust the server's root refuses it.
    let wary = certs(&rogue.pem);
    let (chain, key) = svid(&rogue, &web(), true);
    wary.install(&web(), chain, key).unwrap();
    assert!(handshake(&wary, &web(), &server, &echo()).await.is_err());

    // And with no SVID at all, no handshake.
    let nobody = certs(&ca.pem);
    assert!(handshake(&nobody, &web(), &server, &echo()).await.is_err());
}

#[tokio::test]
async fn svids_and_roots_rotate_without_breaking_open_connections() {
    let old = root("old root");
    let new = root("new root");
    let (client, server) = (certs(&old.pem), certs(&old.pem));
    let (chain, key) = svid(&old, &web(), true);
    client.install(&web(), chain, key).unwrap();
    let (chain, key) = svid(&old, &echo(), true);
    server.install(&echo(), chain, key).unwrap();

    // An open connection from before the rotation.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(server.server_config(&echo()));
    let echoing = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut tls = acceptor.accept(tcp).await.unwrap();
        let mut buf = [0; 1];
        while tls.read_exact(&mut buf).await.is_ok() {
            tls.write_all(&buf).await.unwrap();
        }
    });
    let connector = tokio_rustls::TlsConnector::from(client.client_config(&web()));
    let mut open = connector
        .connect(
            ServerName::IpAddress(addr.ip().into()),
            TcpStream::connect(addr).await.unwrap(),
        )
        .await
        .unwrap();

    // Root rotation: both roots are trusted, the server moves to the new root first.
    let both = format!("{}{}", old.pem, new.pem);
    client.trust().set_bundle(&both).unwrap();
    server.trust().set_bundle(&both).unwrap();
    let (chain, key) = svid(&new, &echo(), true);
    server.install(&echo(), chain, key).unwrap();
    handshake(&client, &web(), &server, &echo()).await.unwrap();
    let (chain, key) = svid(&new, &web(), true);
    client.install(&web(), chain, key).unwrap();
    handshake(&client, &web(), &server, &echo()).await.unwrap();

    // The old root retires: certificates it signed are refused from now on.
    client.trust().set_bundle(&new.pem).unwrap();
    server.trust().set_bundle(&new.pem).unwrap();
    handshake(&client, &web(), &server, &echo()).await.unwrap();
    let stale = certs(&format!("{}{}", old.pem, new.pem));
    let (chain, key) = svid(&old, &web(), true);
    stale.install(&web(), chain, key).unwrap();
    assert!(handshake(&stale, &web(), &server, &echo()).await.is_err());

    // The connection opened before all of this still works.
    open.write_all(b"z").await.unwrap();
    let mut byte = [0];
    open.read_exact(&mut byte).await.unwrap();
    assert_eq!(&byte, b"z");
    drop(open);
    echoing.await.unwrap();
}

#[test]
fn a_bundle_without_certificates_is_refused_and_the_roots_stay() {
    let ca = root("aether root");
    let trust = TrustStore::new(TD);
    assert!(trust.set_bundle(&ca.pem).unwrap());
    assert!(!trust.set_bundle(&ca.pem).unwrap(), "unchanged");
    assert!(trust.set_bundle("").is_err());
    assert!(
        trust
            .set_bundle("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
            .is_err()
    );
    assert_eq!(trust.roots().len(), 1);
}
