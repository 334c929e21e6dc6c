//go:build tools

// Package kube pins k8s.io/kubernetes so that hack/bin-tools.sh can build
// kube-apiserver from the module cache.
package kube

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
