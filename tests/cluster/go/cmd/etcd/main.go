// Command etcd is upstream etcd's server, built from the go.etcd.io/etcd/server/v3
// version that k8s.io/kubernetes pins (the same main as etcd's own release binary).
// Debian 12's etcd 3.4.23 lacks the watch progress requests that kube-apiserver
// 1.36 needs to serve streaming lists (watch with sendInitialEvents=true).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
