//! The capture table through both ways of running nftables, in real network namespaces.
//! Needs root and nftables.

mod common;

use std::net::SocketAddr;

use aether_cni::nft::{self, Deleted, Drift, Families, Nft, NftError, TableSpec};
use common::{Netns, require_root, ruleset};

fn backends() -> [Nft; 2] {
    [Nft::default(), Nft::program("nft")]
}

fn spec(capture_port: u16) -> TableSpec {
    TableSpec {
        capture_port,
        families: Families {
            ipv4: true,
            ipv6: true,
        },
    }
}

fn targets(list: &[&str]) -> Vec<SocketAddr> {
    list.iter().map(|t| t.parse().unwrap()).collect()
}

#[test]
fn libnftables_is_used_when_it_loads() {
    require_root();
    assert!(format!("{:?}", Nft::default()).contains("libnftables"));
}

#[test]
fn install_verify_update_and_delete_with_both_backends() {
    require_root();
    for nft in backends() {
        let netns = Netns::new("aet");
        let path = netns.path();
        let first = targets(&["10.96.0.10:80", "[fd00::10]:443"]);

        nft::install(&nft, path, &spec(15001), &first).unwrap();
        nft::install(&nft, path, &spec(15001), &first).unwrap();
        assert_eq!(
            nft::verify(&nft, path, &spec(15001)).unwrap(),
            [],
            "{nft:?}"
        );
        let text = ruleset(&netns);
        assert_eq!(text.matches("table inet aether").count(), 1, "{text}");
        assert!(
            text.contains("10.96.0.10 . 80") && text.contains("fd00::10 . 443"),
            "{text}"
        );

        // A second ADD with another port replaces the table.
        nft::install(&nft, path, &spec(15006), &first).unwrap();
        assert_eq!(
            nft::verify(&nft, path, &spec(15006)).unwrap(),
            [],
            "{nft:?}"
        );

        nft::replace_elements(
            &nft,
            path,
            spec(15006).families,
            &targets(&["10.96.0.20:8080"]),
        )
        .unwrap();
        let text = ruleset(&netns);
        assert!(text.contains("10.96.0.20 . 8080"), "{text}");
        assert!(
            !text.contains("10.96.0.10") && !text.contains("fd00::10"),
            "{text}"
        );
        assert_eq!(nft::verify(&nft, path, &spec(15006)).unwrap(), []);

        assert_eq!(nft::delete(&nft, path).unwrap(), Deleted::Table);
        assert_eq!(nft::delete(&nft, path).unwrap(), Deleted::Table);
        assert_eq!(
            nft::verify(&nft, path, &spec(15006)).unwrap(),
            [Drift::TableMissing]
        );
        let err = nft::replace_elements(&nft, path, spec(15006).families, &[]).unwrap_err();
        assert!(matches!(err, NftError::Failed { .. }), "{err}");

        netns.delete();
        assert_eq!(nft::delete(&nft, path).unwrap(), Deleted::Netns);
        assert!(matches!(
            nft::verify(&nft, path, &spec(15006)),
            Err(NftError::NetnsGone(_))
        ));
    }
}

#[test]
fn a_missing_nft_program_says_what_to_install() {
    require_root();
    let netns = Netns::new("aet");
    let err = nft::install(
        &Nft::program("/nonexistent/nft"),
        netns.path(),
        &spec(15001),
        &[],
    )
    .unwrap_err();
    assert!(matches!(err, NftError::Spawn { .. }), "{err}");
    assert!(err.to_string().contains("install nftables"), "{err}");
}
