#!/usr/bin/env bash
# Regenerates the gRPC Go code in api/dlock/v1 from api/dlock/v1/dlock.proto.
#
# Needs only Go: buf, protoc-gen-go and protoc-gen-go-grpc are built at pinned
# versions into a temporary GOBIN (no protoc, no buf on PATH, nothing left
# behind but Go's module cache). buf compiles the proto itself and ships the
# google/protobuf well-known types. protoc-gen-go is pinned to the
# google.golang.org/protobuf version in go.mod, so the generated code matches
# the runtime it is compiled against.
#
# Usage: scripts/gen-proto.sh        (from anywhere in the repository)
set -euo pipefail
cd "$(dirname "$0")/.."

BUF_VERSION=v1.75.0
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2
PROTOC_GEN_GO_VERSION=$(go list -m -f '{{.Version}}' google.golang.org/protobuf)

bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT

echo "installing buf $BUF_VERSION, protoc-gen-go $PROTOC_GEN_GO_VERSION, protoc-gen-go-grpc $PROTOC_GEN_GO_GRPC_VERSION"
# Installed from outside the module so they resolve their own dependencies,
# not dlock's go.mod (which they must not change).
(
  cd "$bin"
  export GOBIN="$bin" GOFLAGS=-mod=mod
  go install "github.com/bufbuild/buf/cmd/buf@$BUF_VERSION"
  go install "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO_VERSION"
  go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC_VERSION"
)
export PATH="$bin:$PATH"

# The buf configuration lives here rather than in buf.yaml/buf.gen.yaml files:
# this script is the one place that says how the code is made.
# require_unimplemented_servers=false: dlock serves every method it declares,
# so a method added to the proto but not to internal/grpcapi should fail to
# compile rather than quietly answer UNIMPLEMENTED.
template='{
  "version": "v2",
  "plugins": [
    {"local": "protoc-gen-go", "out": "api", "opt": ["paths=source_relative"]},
    {"local": "protoc-gen-go-grpc", "out": "api", "opt": ["paths=source_relative", "require_unimplemented_servers=false"]}
  ]
}'

buf lint api
rm -f api/dlock/v1/*.pb.go
buf generate api --template "$template"
gofmt -l api/dlock/v1 | (! grep .) || { echo "generated code is not gofmt-clean" >&2; exit 1; }
echo "generated:"
ls api/dlock/v1/*.pb.go
