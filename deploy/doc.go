// Package deploy holds okso's deployment files: the Dockerfile at the
// repository root (built from there), Kubernetes manifests in k8s/, the
// NATS Helm chart's values, and README.md on how to use them. Its only Go
// is a test that lints all of it without Docker or kubectl.
package deploy
