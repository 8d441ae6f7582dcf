// Pinned sources of the monitoring CRDs the chart's optional objects use
// (ServiceMonitor, PodMonitor and PrometheusRule from the
// prometheus-operator, PodMonitoring, ClusterPodMonitoring and ClusterRules from GKE's
// Managed Service for Prometheus): install.sh takes
// their YAML from these modules' zips, verified against go.sum. Nothing is
// built from them.
module bucketmap.dev/tools/monitoring-crds

go 1.26.0

require (
	github.com/GoogleCloudPlatform/prometheus-engine v0.17.2
	github.com/prometheus-operator/prometheus-operator v0.85.0
)
