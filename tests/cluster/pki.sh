# shellcheck shell=bash disable=SC2034 # constants for the scripts that source this file
# Certificates and kubeconfigs of the local cluster, signed by its CA in $PKI.
# Source after lib.sh.

PKI="$AETHER_STATE/pki"

# sign NAME SUBJECT EXTENSIONS [CA]: key + certificate NAME.{key,crt} in $PKI,
# signed by CA (default: self-signed).
sign() {
    local name="$1" subject="$2" extensions="$3" ca="${4:-}"
    local key="$PKI/$name.key" crt="$PKI/$name.crt"
    [ -f "$key" ] || openssl genrsa -out "$key" 2048 2>/dev/null
    local signer=(-signkey "$key")
    [ -n "$ca" ] && signer=(-CA "$PKI/$ca.crt" -CAkey "$PKI/$ca.key")
    openssl req -new -key "$key" -subj "$subject" |
        openssl x509 -req -sha256 -days 3650 "${signer[@]}" -out "$crt" \
            -extfile <(printf '%b\n' "$extensions") 2>/dev/null
}

CA_EXT='basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign,digitalSignature\nsubjectKeyIdentifier=hash'
CLIENT_EXT='basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth'
SERVER_EXT='basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth'

# write_kubeconfig NAME SERVER: $AETHER_STATE/NAME.kubeconfig with the client
# cert NAME, for the API server at SERVER.
write_kubeconfig() {
    local name="$1" server="$2"
    cat > "$AETHER_STATE/$name.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: aether
  cluster:
    server: $server
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $name
  user:
    client-certificate-data: $(base64 -w0 "$PKI/$name.crt")
    client-key-data: $(base64 -w0 "$PKI/$name.key")
contexts:
- name: aether
  context:
    cluster: aether
    user: $name
current-context: aether
EOF
    chmod 600 "$AETHER_STATE/$name.kubeconfig"
}

