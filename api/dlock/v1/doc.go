// Package dlockv1 is dlock's gRPC API, generated from dlock.proto by
// scripts/gen-proto.sh; internal/grpcapi serves it. Do not edit the .pb.go
// files by hand.
package dlockv1
