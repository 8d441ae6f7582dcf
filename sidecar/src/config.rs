//! Command line of `bucketmap-sidecar`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use http::Uri;

use crate::names::is_valid_bucket_name;

/// Prefix under which the main listener serves the sidecar's own endpoints
/// (`/_bucketmap/healthz`, `/_bucketmap/readyz`, `/_bucketmap/metrics`). A
/// bucket name cannot start with `_`, so no path-style XML API request and no
/// JSON API path can collide with it; on virtual-hosted requests
/// (`Host: bucket.…`) the prefix is not special, it is an object name there.
pub const INTERNAL_PREFIX: &str = "/_bucketmap/";

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// HTTP version the sidecar speaks to the HTTP upstream (`--upstream-http`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum UpstreamHttp {
    /// HTTP/2 when TLS ALPN offers it (GCS does), else HTTP/1.1; plain
    /// http:// upstreams get HTTP/1.1.
    Auto,
    /// HTTP/1.1 only: a pool of keep-alive connections. The default: it
    /// costs less CPU per request, adds less latency and streams faster
    /// than one multiplexed HTTP/2 connection (docs/BENCHMARKS.md).
    #[default]
    #[value(name = "1.1")]
    Http1,
    /// HTTP/2 only: one multiplexed connection (h2c prior knowledge for
    /// http:// upstreams).
    #[value(name = "2")]
    Http2,
}

/// Lets unmodified Google Cloud Storage clients use logical bucket names.
///
/// Point the application at the sidecar (for example
/// STORAGE_EMULATOR_HOST=http://127.0.0.1:9023). Requests naming a logical
/// bucket ("photos") are forwarded to the upstream with the physical name
/// ("photos-k3x9q2mw"); responses name the logical bucket again.
///
/// Besides the GCS APIs (JSON, upload, download, batch and XML API, path and
/// virtual-hosted style), the listener serves /_bucketmap/healthz,
/// /_bucketmap/readyz and /_bucketmap/metrics (the "_" prefix cannot be a
/// bucket name, so it never collides with a GCS path). --admin-addr serves
/// /healthz, /readyz and /metrics on a separate listener that never proxies:
/// in a pod it is the kubelet's probe target and Prometheus' scrape target,
/// on the pod IP, while the proxy stays on loopback. readyz answers 200 once
/// the mapping sources have been read successfully (an empty mapping
/// directory counts: every bucket name then gets a GCS-style 404), and 503
/// with the reason until then. SIGTERM stops accepting connections and drains
/// requests in flight. Logs go to stderr; the level is set with RUST_LOG
/// (default "info").
#[derive(Clone, Debug, Parser)]
#[command(name = "bucketmap-sidecar", version, about, long_about)]
pub struct Config {
    /// Address the proxy listens on.
    #[arg(long, default_value = "127.0.0.1:9023", value_name = "ADDR")]
    pub listen: SocketAddr,

    /// Base URL of the GCS endpoint to forward to (http:// for emulators such as fake-gcs-server).
    #[arg(long, default_value = "https://storage.googleapis.com", value_name = "URL", value_parser = parse_upstream)]
    pub upstream: Uri,

    /// Base URL of the GCS gRPC endpoint (`google.storage.v2`) gRPC requests
    /// are forwarded to, over HTTP/2: TLS for https://, h2c (prior knowledge)
    /// for http:// (emulators such as the in-repo mock GCS).
    #[arg(long, default_value = "https://storage.googleapis.com", value_name = "URL", value_parser = parse_upstream)]
    pub grpc_upstream: Uri,

    /// PEM file of CA certificates trusted for the upstreams (HTTP and
    /// gRPC) besides the bundled web PKI roots: a private GCS endpoint, or a
    /// TLS emulator with a throwaway CA.
    #[arg(long, value_name = "PATH")]
    pub upstream_ca_file: Option<std::path::PathBuf>,

    /// HTTP version spoken to --upstream: "1.1" keeps a pool of HTTP/1.1
    /// keep-alive connections (less CPU and latency per request, faster
    /// streams), "2" multiplexes requests over one HTTP/2 connection (h2c for
    /// http://; fewer connections, less memory with many concurrent
    /// streams), "auto" takes HTTP/2 when TLS ALPN offers it (as GCS does)
    /// and HTTP/1.1 otherwise. The gRPC upstream is always HTTP/2.
    #[arg(long, value_enum, default_value = "1.1", value_name = "VERSION")]
    pub upstream_http: UpstreamHttp,

    /// Largest gRPC message (after decompression) the sidecar reads to
    /// rewrite, in bytes; larger ones are refused with RESOURCE_EXHAUSTED.
    /// GCS sends and accepts messages of at most a few MiB.
    #[arg(long, default_value = "33554432", value_name = "BYTES")]
    pub grpc_max_message_bytes: usize,

    /// Directory holding the mapping as a mounted ConfigMap: one file per
    /// logical name whose content is the physical name (whitespace trimmed);
    /// entries starting with "." are ignored. Reloaded on change.
    #[arg(long, value_name = "DIR")]
    pub mapping_dir: Option<PathBuf>,

    /// A static mapping entry LOGICAL=PHYSICAL; repeatable. Combined with
    /// --mapping-dir, these entries win over the directory's.
    #[arg(long = "map", value_name = "LOGICAL=PHYSICAL", value_parser = parse_map_entry)]
    pub maps: Vec<(String, String)>,

    /// Follow the bucket map ConfigMap NAME of the pod's namespace through
    /// the Kubernetes API server (a watch, confirmed by a consistent list
    /// every quarter of --max-map-age), with the ServiceAccount token of
    /// --kube-credentials-dir: a changed map is served within the API
    /// server's watch latency. --mapping-dir stays the start-up source and
    /// the fallback until the API server first answers. The ServiceAccount
    /// needs get, list and watch on that ConfigMap (bucketmap grants it).
    #[arg(long, value_name = "NAME")]
    pub map_configmap: Option<String>,

    /// With --map-configmap: the longest the map may go unconfirmed by the
    /// API server before the sidecar refuses writes (reads are still
    /// served; writes resume once the map is confirmed again). The operator
    /// changes where a logical bucket points only once the change is older
    /// than this bound (docs/ARCHITECTURE.md).
    #[arg(long, default_value = "60s", value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub max_map_age: Duration,

    /// How long a write waits while a move of its bucket holds it (its map
    /// entry is fenced: reads go on, writes wait until the move opens the
    /// entry, usually on the new bucket). Past it the write is answered 503
    /// backendNotReady (gRPC UNAVAILABLE), which clients retry.
    #[arg(
        long,
        default_value = "30s",
        value_name = "DURATION",
        value_parser = humantime::parse_duration,
        env = "BUCKETMAP_SIDECAR_HOLD_LIMIT"
    )]
    pub hold_limit: Duration,

    /// With --map-configmap: the API server's base URL. By default the
    /// cluster's, from KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT.
    #[arg(long, value_name = "URL", value_parser = parse_upstream)]
    pub kube_api: Option<Uri>,

    /// With --map-configmap: the directory holding the ServiceAccount's
    /// `token` (re-read for every request: the kubelet rotates it),
    /// `ca.crt` and `namespace`, as the kubelet projects them.
    #[arg(
        long,
        default_value = "/var/run/secrets/kubernetes.io/serviceaccount",
        value_name = "DIR"
    )]
    pub kube_credentials_dir: PathBuf,

    /// How often the mapping directory is re-read, in addition to file-change notifications.
    #[arg(long, default_value = "2s", value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub mapping_poll_interval: Duration,

    /// Forward requests without adding Application Default Credentials (for emulators).
    #[arg(long)]
    pub no_auth: bool,

    /// Accept physical bucket names in requests (by default they are refused with 403
    /// so that applications cannot depend on one environment's names).
    #[arg(long)]
    pub allow_physical_names: bool,

    /// Largest metadata body (JSON, XML, batch, the metadata part of a multipart
    /// upload) the sidecar reads into memory; larger ones get 413. Object data is
    /// always streamed and not limited.
    #[arg(long, default_value_t = 8 * 1024 * 1024, value_name = "BYTES")]
    pub max_metadata_bytes: usize,

    /// Base URL (scheme and host[:port], no path) that absolute links in
    /// responses (selfLink, mediaLink, resumable session URLs) point at, when
    /// clients reach the sidecar under another address than --listen (a
    /// Service, a port mapping). By default links use the listen address.
    #[arg(long, value_name = "URL", value_parser = parse_advertise_url)]
    pub advertise_url: Option<Uri>,

    /// Optional separate listener for /healthz, /readyz and /metrics, which
    /// never proxies (--metrics-addr is its former name).
    #[arg(long, value_name = "ADDR", visible_alias = "metrics-addr")]
    pub admin_addr: Option<SocketAddr>,

    /// Log format on stderr.
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// Timeout for connecting to the upstream.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub connect_timeout: Duration,

    /// Time a client has to send its request headers.
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub header_read_timeout: Duration,

    /// Time the upstream has to answer with response headers once the request
    /// is sent, including the request body upload; 0 disables it (the default,
    /// as uploading a large object may take long).
    #[arg(long, default_value = "0s", value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub upstream_timeout: Duration,

    /// How long an idle upstream connection is kept for reuse; past it, it is
    /// not reused and is closed (within twice this time).
    #[arg(long, default_value = "90s", value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub pool_idle_timeout: Duration,

    /// On SIGTERM or SIGINT, how long in-flight requests may take to finish before exit.
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,

    /// Requests served at once; more wait. Bounds memory, as each may hold a
    /// metadata body of up to --max-metadata-bytes.
    #[arg(long, default_value_t = 256, value_name = "N")]
    pub max_concurrent_requests: usize,

    /// Largest request head (request line and headers) accepted from a
    /// client; larger ones get 431. It is also the most each client
    /// connection buffers while reading, so it bounds memory under many
    /// concurrent uploads. The default is twice Node.js's limit and above
    /// what GCS clients send (custom metadata is capped at 8 KiB by GCS).
    #[arg(long, default_value_t = 32 * 1024, value_name = "BYTES")]
    pub max_header_bytes: usize,

    /// Threads serving requests. 1 (the default) runs everything on one
    /// thread, which costs the least CPU per request: a sidecar serves one
    /// application. More threads spread a busy pod's load over cores.
    #[arg(
        long,
        default_value_t = 1,
        value_name = "N",
        env = "BUCKETMAP_SIDECAR_WORKER_THREADS"
    )]
    pub worker_threads: usize,
}

impl Config {
    /// Checks what clap cannot check on its own.
    pub fn validate(&self) -> Result<(), String> {
        if self.mapping_dir.is_none() && self.maps.is_empty() && self.map_configmap.is_none() {
            return Err(
                "give the mapping with --mapping-dir DIR, --map-configmap NAME and/or --map LOGICAL=PHYSICAL".into(),
            );
        }
        if self.map_configmap.is_some() && self.max_map_age < Duration::from_secs(4) {
            return Err("--max-map-age must be at least 4s".into());
        }
        if self.mapping_poll_interval.is_zero() {
            return Err("--mapping-poll-interval must be more than 0".into());
        }
        if self.max_concurrent_requests == 0 {
            return Err("--max-concurrent-requests must be at least 1".into());
        }
        if self.worker_threads == 0 {
            return Err("--worker-threads must be at least 1".into());
        }
        if self.max_header_bytes < 8192 {
            return Err("--max-header-bytes must be at least 8192".into());
        }
        Ok(())
    }
}

fn parse_advertise_url(raw: &str) -> Result<Uri, String> {
    parse_upstream(raw).map_err(|e| e.replace("upstream", "advertise URL"))
}

fn parse_upstream(raw: &str) -> Result<Uri, String> {
    let uri: Uri = raw
        .parse()
        .map_err(|e| format!("invalid URL {raw:?}: {e}"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => {
            return Err(format!(
                "upstream {raw:?} must start with http:// or https://"
            ));
        }
    }
    if uri.authority().is_none() {
        return Err(format!("upstream {raw:?} has no host"));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(format!("upstream {raw:?} must not have a path or query"));
    }
    Ok(uri)
}

fn parse_map_entry(raw: &str) -> Result<(String, String), String> {
    let (logical, physical) = raw
        .split_once('=')
        .ok_or_else(|| format!("{raw:?} is not LOGICAL=PHYSICAL"))?;
    let (logical, physical) = (logical.trim(), physical.trim());
    for name in [logical, physical] {
        if !is_valid_bucket_name(name) {
            return Err(format!("{name:?} in {raw:?} is not a valid bucket name"));
        }
    }
    Ok((logical.to_owned(), physical.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Config, clap::Error> {
        Config::try_parse_from(std::iter::once("bucketmap-sidecar").chain(args.iter().copied()))
    }

    #[test]
    fn clap_definition_is_consistent() {
        Config::command().debug_assert();
    }

    #[test]
    fn defaults() {
        let cfg = parse(&["--map", "photos=photos-k3x9q2mw"]).expect("parses");
        assert_eq!(cfg.listen.to_string(), "127.0.0.1:9023");
        assert_eq!(cfg.upstream.to_string(), "https://storage.googleapis.com/");
        assert_eq!(
            cfg.maps,
            vec![("photos".to_owned(), "photos-k3x9q2mw".to_owned())]
        );
        assert_eq!(cfg.mapping_poll_interval, Duration::from_secs(2));
        assert_eq!(cfg.max_metadata_bytes, 8 * 1024 * 1024);
        assert_eq!(cfg.hold_limit, Duration::from_secs(30));
        assert!(cfg.validate().is_ok());
    }

    #[test]
    fn upstream_http_versions() {
        let version = |args: &[&str]| {
            let mut all = vec!["--map", "photos=photos-k3x9q2mw"];
            all.extend_from_slice(args);
            parse(&all).map(|cfg| cfg.upstream_http)
        };
        assert_eq!(version(&[]).expect("default"), UpstreamHttp::Http1);
        assert_eq!(
            version(&["--upstream-http", "auto"]).expect("auto"),
            UpstreamHttp::Auto
        );
        assert_eq!(
            version(&["--upstream-http", "1.1"]).expect("1.1"),
            UpstreamHttp::Http1
        );
        assert_eq!(
            version(&["--upstream-http", "2"]).expect("2"),
            UpstreamHttp::Http2
        );
        for bad in ["1", "http2", "h2", ""] {
            assert!(
                version(&["--upstream-http", bad]).is_err(),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn rejects_bad_values() {
        assert!(parse(&["--map", "photos"]).is_err());
        assert!(parse(&["--map", "Photos=x-y-z"]).is_err());
        assert!(parse(&["--upstream", "ftp://x"]).is_err());
        assert!(parse(&["--upstream", "http://x/storage"]).is_err());
        let no_mapping = parse(&[]).expect("parses");
        assert!(no_mapping.validate().is_err());
        let no_threads =
            parse(&["--map", "photos=photos-k3x9q2mw", "--worker-threads", "0"]).expect("parses");
        assert!(no_threads.validate().is_err());
    }

    #[test]
    fn the_admin_listener_keeps_its_former_name() {
        for flag in ["--admin-addr", "--metrics-addr"] {
            let cfg =
                parse(&["--map", "photos=photos-k3x9q2mw", flag, "0.0.0.0:9024"]).expect("parses");
            assert_eq!(
                cfg.admin_addr.map(|a| a.to_string()).as_deref(),
                Some("0.0.0.0:9024"),
                "{flag}"
            );
        }
    }

    #[test]
    fn advertise_url_is_an_http_base_url() {
        let base = ["--map", "photos=photos-k3x9q2mw", "--advertise-url"];
        let cfg = parse(&[&base[..], &["http://sidecar.local:9023"]].concat()).expect("parses");
        assert_eq!(
            cfg.advertise_url.map(|u| u.to_string()).as_deref(),
            Some("http://sidecar.local:9023/")
        );
        for bad in [
            "sidecar.local:9023",
            "ftp://x",
            "http://x/path",
            "http://x/?q",
        ] {
            let err = parse(&[&base[..], &[bad]].concat())
                .map(|_| ())
                .map_err(|e| e.to_string());
            assert!(
                err.as_ref().is_err_and(|e| e.contains("advertise URL")),
                "{bad}: {err:?}"
            );
        }
        assert!(
            Config::command()
                .render_long_help()
                .to_string()
                .contains("--advertise-url")
        );
    }

    #[test]
    fn help_documents_every_flag() {
        let help = Config::command().render_long_help().to_string();
        for flag in [
            "--listen",
            "--upstream",
            "--mapping-dir",
            "--map",
            "--mapping-poll-interval",
            "--no-auth",
            "--allow-physical-names",
            "--max-metadata-bytes",
            "--admin-addr",
            "--metrics-addr",
            "--log-format",
            "--connect-timeout",
            "--header-read-timeout",
            "--upstream-timeout",
            "--drain-timeout",
            "--pool-idle-timeout",
            "--max-header-bytes",
            "--worker-threads",
            "--hold-limit",
            "/_bucketmap/readyz",
            "empty mapping",
        ] {
            assert!(help.contains(flag), "help lacks {flag}");
        }
    }
}
