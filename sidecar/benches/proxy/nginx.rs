//! nginx, the proxy a user would deploy instead: Debian's nginx 1.22 from
//! `tools/nginx/install.sh`, one process (`master_process off`), a
//! keep-alive pool to the upstream, request and response bodies streamed
//! (not buffered to disk). Two configurations:
//! - plain: a reverse proxy, requests name the physical bucket;
//! - rewrite: the off-the-shelf way to do the sidecar's job, `rewrite` of
//!   the logical bucket in the path to the physical one and `sub_filter` of
//!   the physical name back to the logical one in JSON answers (with
//!   `Accept-Encoding` cleared so that sub_filter sees plain text).

use super::*;

/// nginx's binary, from `NGINX_BIN` or `tools/nginx/install.sh`.
pub(crate) fn nginx_bin() -> Result<PathBuf> {
    tool_bin("NGINX_BIN", "nginx")
}

/// Which configuration nginx runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NginxMode {
    /// A plain reverse proxy.
    Plain,
    /// `rewrite` of the bucket path and `sub_filter` of the name in JSON.
    Rewrite,
}

/// The upstream nginx proxies to: plain HTTP, or TLS verified against `ca_file`.
pub(crate) struct NginxUpstream<'a> {
    pub(crate) addr: SocketAddr,
    pub(crate) ca_file: Option<&'a Path>,
}

/// The configuration nginx runs with, listening on `listen`, its files
/// (pid, logs, temporary bodies) under `prefix`.
pub(crate) fn nginx_conf(
    mode: NginxMode,
    upstream: &NginxUpstream<'_>,
    listen: SocketAddr,
    prefix: &Path,
) -> String {
    let p = prefix.display();
    let scheme = if upstream.ca_file.is_some() {
        "https"
    } else {
        "http"
    };
    let tls = upstream.ca_file.map_or_else(String::new, |ca| {
        format!(
            "proxy_ssl_trusted_certificate {}; proxy_ssl_verify on; proxy_ssl_server_name on; proxy_ssl_name {TLS_NAME}; proxy_ssl_session_reuse on;",
            ca.display()
        )
    });
    let rewrite = match mode {
        NginxMode::Plain => String::new(),
        NginxMode::Rewrite => format!(
            concat!(
                "rewrite ^/(storage/v1|upload/storage/v1|download/storage/v1)/b/{l}(/.*)?$ /$1/b/{p}$2 break;\n",
                "      proxy_set_header Accept-Encoding \"\";\n",
                "      sub_filter_types application/json;\n",
                "      sub_filter_once off;\n",
                "      sub_filter '{p}' '{l}';"
            ),
            l = LOGICAL,
            p = PHYSICAL
        ),
    };
    format!(
        r#"daemon off;
master_process off;
worker_processes 1;
pid {p}/nginx.pid;
error_log {p}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  default_type application/octet-stream;
  client_body_temp_path {p}/client_body;
  proxy_temp_path {p}/proxy;
  fastcgi_temp_path {p}/fastcgi;
  uwsgi_temp_path {p}/uwsgi;
  scgi_temp_path {p}/scgi;
  client_max_body_size 0;
  upstream backend {{
    server {upstream};
    keepalive 64;
  }}
  server {{
    listen {listen};
    location = /_nginx/ready {{ return 200; }}
    location / {{
      {rewrite}
      proxy_pass {scheme}://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_request_buffering off;
      proxy_buffering off;
      {tls}
    }}
  }}
}}
"#,
        upstream = upstream.addr
    )
}

/// Starts nginx (`bin`) in `mode` in front of `upstream`, in a directory of
/// its own under `dir`.
pub(crate) async fn start_nginx(
    client: &HttpClient,
    bin: &Path,
    mode: NginxMode,
    upstream: &NginxUpstream<'_>,
    dir: &Path,
    tag: &str,
    launch: Launch<'_>,
) -> Result<(Proc, SocketAddr)> {
    let name = match mode {
        NginxMode::Plain => "nginx",
        NginxMode::Rewrite => "nginx-rewrite",
    };
    // nginx's configuration takes no spaces in unquoted paths.
    let prefix = dir.join(format!("{name}-{}", tag.replace(' ', "-")));
    std::fs::create_dir_all(&prefix)
        .with_context(|| format!("cannot create {}", prefix.display()))?;
    let conf = prefix.join("nginx.conf");
    start_on_free_port(
        client,
        name,
        "/_nginx/ready",
        &prefix.join("stderr"),
        |addr| {
            // A failed write shows as nginx failing to start, with its log.
            let _ = std::fs::write(&conf, nginx_conf(mode, upstream, addr, &prefix));
            let mut cmd = launch.command(bin);
            cmd.arg("-p")
                .arg(&prefix)
                .arg("-e")
                .arg(prefix.join("error.log"))
                .arg("-c")
                .arg(&conf);
            cmd
        },
    )
    .await
}
