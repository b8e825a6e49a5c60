#!/usr/bin/env bash
# A throwaway CA and one certificate per site for the example configs.
#
#   bash make-pki.sh [DIR]        (default DIR: ./pki next to this script)
#
# Each site certificate has CN and DNS SAN = the site id and may serve as both
# server and client certificate: the receiver presents it to its sources and
# the sender sessions present it to their destinations, which read the source
# id from it (mTLS identity). For trials only: in production, use your own CA
# and keep its key offline.
set -euo pipefail
dir="${1:-$(cd "$(dirname "$0")" && pwd)/pki}"
sites="${SITES:-site-a site-b site-c}"
days="${DAYS:-30}"
mkdir -p "$dir"
cd "$dir"
ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.pem -days "$days" \
    -subj "/O=lr example/CN=lr example CA" 2>/dev/null
for site in $sites; do
    openssl req -new "${ec[@]}" -keyout "$site.key" -out "$site.csr" \
        -subj "/O=lr example/CN=$site" 2>/dev/null
    printf '%s\n' "subjectAltName=DNS:$site" "basicConstraints=CA:FALSE" \
        "keyUsage=critical,digitalSignature" "extendedKeyUsage=serverAuth,clientAuth" \
        > "$site.ext"
    openssl x509 -req -in "$site.csr" -CA ca.pem -CAkey ca.key -CAcreateserial \
        -out "$site.pem" -days "$days" -extfile "$site.ext" 2>/dev/null
    rm -f "$site.csr" "$site.ext"
    chmod 600 "$site.key"
done
chmod 600 ca.key
echo "wrote $dir: ca.pem and $(echo "$sites" | wc -w) site certificates"
