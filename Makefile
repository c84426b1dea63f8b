# Release builds and the container image. The two commands of README.md need
# none of this: go run ./cmd/dlock dev, go test -race ./...

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/dlock/dlock/internal/buildinfo.Version=$(VERSION)
PLATFORMS := linux/amd64 linux/arm64 darwin/amd64 darwin/arm64
IMAGE ?= dlock:$(VERSION)

.PHONY: build release image clean console-check

# A static binary for this machine, stamped with the version and commit.
build:
	CGO_ENABLED=0 go build -trimpath -buildvcs=true -ldflags '$(LDFLAGS)' -o dist/dlock ./cmd/dlock

# Static binaries for every platform in PLATFORMS, with SHA-256 sums.
release:
	@mkdir -p dist
	@for p in $(PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; out=dist/dlock-$(VERSION)-$$os-$$arch; \
		echo "build $$out"; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch go build -trimpath -buildvcs=true -ldflags '$(LDFLAGS)' -o $$out ./cmd/dlock || exit 1; \
	done
	cd dist && sha256sum dlock-$(VERSION)-* > SHA256SUMS

# The container image (deploy/Dockerfile), built offline from the binary.
image:
	CGO_ENABLED=0 GOOS=linux go build -trimpath -buildvcs=true -ldflags '$(LDFLAGS)' -o deploy/container/dlock ./cmd/dlock
	podman build --format docker -t $(IMAGE) -f deploy/Dockerfile deploy/container

clean:
	rm -rf dist deploy/container/dlock

# The web console: what the binary embeds is exactly internal/console/assets
# (no build step: the embedded files are the sources), self-contained, and
# served with its security headers. CI runs these with every other test.
console-check:
	go test -count=1 -run 'TestEmbeddedMatchesSources|TestAssetsAreSelfContained|TestHandler' ./internal/console/
