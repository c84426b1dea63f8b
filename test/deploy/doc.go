// Package deploy checks the deployment artifacts under deploy/ against the
// real thing: the container image built and run as a 3-node cluster, the
// systemd unit verified by systemd, the Prometheus rules by promtool, and
// every metric the alerts and the dashboard name against a running node.
// Each check needs a tool from Debian (podman and runc, systemd, prometheus's
// promtool); .ci/run installs them, and without one the check is skipped
// with the package to install.
package deploy
