#!/usr/bin/env bash
# A private CA and the Spark Connect TLS proxy's certificate (docs/operations.md, "Security").
#   deploy/tls/make-certs.sh [DIR] [NAME...]
# writes DIR (default deploy/tls/certs, git-ignored) with ca.pem (give it to clients as
# GRPC_DEFAULT_SSL_ROOTS_FILE_PATH), server.pem and server.key (the proxy's; owner-only). NAME:
# the host names clients use (default: spark-connect, the Kubernetes Service's names, localhost).
# Rotate: run it again and restart the proxy and the clients. With a CA of your own, put its
# server.pem/server.key there instead.
set -euo pipefail
dir="${1:-$(dirname "$0")/certs}"
shift || true
names=("$@")
if [ "${#names[@]}" -eq 0 ]; then
  names=(spark-connect spark-connect.spark.svc spark-connect.spark.svc.cluster.local localhost)
fi
san="IP:127.0.0.1"
for n in "${names[@]}"; do san="$san,DNS:$n"; done
mkdir -p "$dir"
chmod 700 "$dir"
cd "$dir"
umask 077
openssl req -x509 -newkey rsa:3072 -nodes -days 825 -subj "/CN=dedup_pipeline Spark Connect CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -keyout ca.key -out ca.pem 2>/dev/null
openssl req -newkey rsa:3072 -nodes -subj "/CN=${names[0]}" -keyout server.key -out server.csr \
  2>/dev/null
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$san" > server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 825 \
  -extfile server.ext -out server.pem 2>/dev/null
rm -f server.csr server.ext ca.srl
chmod 644 ca.pem server.pem
echo "wrote $(pwd)/ca.pem, server.pem, server.key for: ${names[*]}"
