//! A real kube-apiserver + etcd control plane for tests and `bucketmap dev`.
