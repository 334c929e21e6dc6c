//go:build tools

// Package etcd pins go.etcd.io/etcd/server/v3 so that hack/bin-tools.sh can
// build etcd from the module cache.
package etcd

import _ "go.etcd.io/etcd/server/v3"
