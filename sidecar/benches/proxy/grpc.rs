//! gRPC: google.storage.v2 over h2c, the in-repo mock GCS direct and via the sidecar.

use super::*;

/// The generated `google.storage.v2.Storage` client over a plain hyper h2c
/// client (no tonic `Channel`: nothing between the call and the wire but
/// what any gRPC client does).
pub(crate) type GrpcClient = StorageClient<Client<HttpConnector, tonic::body::Body>>;
/// Bytes per WriteObject data message and per mock read chunk.
pub(crate) const GRPC_CHUNK: usize = 2 * MIB as usize;
/// Unary calls per block; the blocks alternate between the paths.
pub(crate) const GRPC_BLOCK: u32 = 100;

pub(crate) fn grpc_client(addr: SocketAddr) -> Result<GrpcClient> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let transport = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build(connector);
    let origin: Uri = format!("http://{addr}").parse()?;
    Ok(StorageClient::with_origin(transport, origin)
        .max_decoding_message_size(4 * GRPC_CHUNK)
        .max_encoding_message_size(4 * GRPC_CHUNK))
}

/// `message` with the routing header Google's clients send for `bucket`.
pub(crate) fn routed<T>(message: T, bucket: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Ok(value) = format!("bucket=projects%2F_%2Fbuckets%2F{bucket}").parse() {
        request
            .metadata_mut()
            .insert("x-goog-request-params", value);
    }
    request
}

pub(crate) fn grpc_bucket(bucket: &str) -> String {
    format!("projects/_/buckets/{bucket}")
}

/// The mock GCS on its own thread and single-threaded runtime (as the HTTP
/// upstream), holding the physical bucket, object `x` (595 bytes) and
/// object `big` (`size` bytes). Serves until the bench exits.
pub(crate) fn start_mock_gcs(size: u64, chunk: &Bytes) -> Result<SocketAddr> {
    let mut data = Vec::with_capacity(usize::try_from(size)?);
    while (data.len() as u64) < size {
        data.extend_from_slice(chunk);
    }
    data.truncate(usize::try_from(size)?);
    let (tx, rx) = std::sync::mpsc::channel::<Result<SocketAddr>>();
    std::thread::Builder::new()
        .name("bench-mock-gcs".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("mock GCS runtime");
            runtime.block_on(async move {
                let started = async {
                    let mock = MockGcs::start().await?;
                    let handle = mock.handle();
                    let bucket = proto::Bucket {
                        bucket_id: PHYSICAL.to_owned(),
                        ..Default::default()
                    };
                    handle.insert_bucket("bench", bucket)?;
                    handle.put_object_data(PHYSICAL, "x", vec![b'x'; 595])?;
                    handle.put_object_data(PHYSICAL, "big", data)?;
                    anyhow::Ok(mock)
                };
                match started.await {
                    Ok(mock) => {
                        let _ = tx.send(Ok(mock.addr()));
                        std::future::pending::<()>().await;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                }
            });
        })
        .context("cannot start the mock GCS thread")?;
    rx.recv()
        .context("the mock GCS thread ended before it started")?
}

/// Starts the sidecar with its gRPC upstream the mock at `mock` (the HTTP
/// upstream is the in-process one, unused here).
pub(crate) async fn start_grpc_sidecar(
    client: &HttpClient,
    upstream: SocketAddr,
    mock: SocketAddr,
    dir: &Path,
    allow_physical: bool,
) -> Result<(Proc, SocketAddr)> {
    let upstream = format!("http://{upstream}");
    let grpc_upstream = format!("http://{mock}");
    let mut extra = vec!["--grpc-upstream", grpc_upstream.as_str()];
    if allow_physical {
        extra.push("--allow-physical-names");
    }
    start_sidecar_to(client, &upstream, &extra, dir, "grpc", Launch::Plain).await
}

/// One unary GetObject of `x`: its latency, after checking the answer
/// names `bucket` (so the sidecar's answers really were rewritten).
pub(crate) async fn grpc_get(client: &mut GrpcClient, bucket: &str) -> Result<Duration> {
    let request = proto::GetObjectRequest {
        bucket: grpc_bucket(bucket),
        object: "x".into(),
        ..Default::default()
    };
    let started = Instant::now();
    let object = tokio::time::timeout(METADATA_TIMEOUT, client.get_object(routed(request, bucket)))
        .await
        .map_err(|_| anyhow!("GetObject timed out after {METADATA_TIMEOUT:?}"))??
        .into_inner();
    let elapsed = started.elapsed();
    if object.bucket != grpc_bucket(bucket) || object.size != 595 {
        bail!(
            "GetObject answered {} ({} bytes)",
            object.bucket,
            object.size
        );
    }
    Ok(elapsed)
}

/// One ReadObject of `big`, every byte counted; the time to the last one.
pub(crate) async fn grpc_read(
    client: &mut GrpcClient,
    bucket: &str,
    size: u64,
) -> Result<Duration> {
    let request = proto::ReadObjectRequest {
        bucket: grpc_bucket(bucket),
        object: "big".into(),
        ..Default::default()
    };
    let started = Instant::now();
    let work = async {
        let mut stream = client
            .read_object(routed(request, bucket))
            .await?
            .into_inner();
        let mut received = 0u64;
        while let Some(message) = stream.message().await? {
            if let Some(data) = message.checksummed_data {
                received += data.content.len() as u64;
            }
        }
        anyhow::Ok(received)
    };
    let received = tokio::time::timeout(STREAM_TIMEOUT, work)
        .await
        .map_err(|_| anyhow!("ReadObject timed out after {STREAM_TIMEOUT:?}"))??;
    if received != size {
        bail!("ReadObject got {received} bytes, expected {size}");
    }
    Ok(started.elapsed())
}

/// One WriteObject of `size` bytes in 2 MiB messages, generated as the
/// transport asks for them; the time to the answer.
pub(crate) async fn grpc_write(
    client: &mut GrpcClient,
    bucket: &str,
    size: u64,
    chunk: &Bytes,
) -> Result<Duration> {
    use proto::write_object_request::{Data, FirstMessage};
    let spec = proto::WriteObjectSpec {
        resource: Some(proto::Object {
            name: "written".into(),
            bucket: grpc_bucket(bucket),
            ..Default::default()
        }),
        object_size: i64::try_from(size).ok(),
        ..Default::default()
    };
    let message: Vec<u8> = chunk.iter().copied().cycle().take(GRPC_CHUNK).collect();
    let count = size.div_ceil(GRPC_CHUNK as u64);
    let messages = futures::stream::iter((0..count).map(move |i| {
        let offset = i * GRPC_CHUNK as u64;
        let len = (size - offset).min(GRPC_CHUNK as u64) as usize;
        proto::WriteObjectRequest {
            write_offset: offset as i64,
            first_message: (i == 0).then(|| FirstMessage::WriteObjectSpec(spec.clone())),
            data: Some(Data::ChecksummedData(proto::ChecksummedData {
                content: message[..len].to_vec(),
                crc32c: None,
            })),
            finish_write: i + 1 == count,
            ..Default::default()
        }
    }));
    let started = Instant::now();
    let response = tokio::time::timeout(
        STREAM_TIMEOUT,
        client.write_object(routed(messages, bucket)),
    )
    .await
    .map_err(|_| anyhow!("WriteObject timed out after {STREAM_TIMEOUT:?}"))??
    .into_inner();
    let elapsed = started.elapsed();
    match response.write_status {
        Some(proto::write_object_response::WriteStatus::Resource(object))
            if object.size as u64 == size && object.bucket == grpc_bucket(bucket) =>
        {
            Ok(elapsed)
        }
        other => bail!("WriteObject answered {other:?}"),
    }
}

/// The paths of the gRPC phase, in the order of the figures.
pub(crate) const GRPC_PATHS: [&str; 3] = ["direct", "h2 relay", "sidecar"];
const RELAY: usize = 1;
const SIDECAR: usize = 2;

/// The gRPC figures: direct to the mock GCS, through the h2 relay, and
/// through the sidecar; and the HTTP path's metadata GET beside them.
pub(crate) struct GrpcFigures {
    pub(crate) calls: u32,
    pub(crate) size: u64,
    /// Unary GetObject latency per path of [`GRPC_PATHS`].
    pub(crate) latencies: [Latencies; 3],
    /// The JSON API's metadata GET of an object, direct to the in-process
    /// upstream and through the same sidecar process, in the same blocks.
    pub(crate) http: [Latencies; 2],
    /// MiB/s per repetition and path, per direction.
    pub(crate) rates: Vec<(Direction, [Vec<f64>; 3])>,
    /// Per direction, as `rates`: the proxy's CPU time per MiB over all
    /// repetitions, in ms, as the kernel accounts it (`None`: direct, no
    /// proxy).
    pub(crate) cpu_per_mib: Vec<[Option<f64>; 3]>,
    pub(crate) idle_rss_kib: u64,
    pub(crate) hwm_kib: u64,
    /// The sidecar was sent physical names (`BUCKETMAP_BENCH_GRPC_PHYSICAL`).
    pub(crate) physical: bool,
}

/// The clients of one gRPC phase: one per gRPC path, and the HTTP path's.
struct GrpcPaths {
    grpc: [(GrpcClient, &'static str); 3],
    http: [Uri; 2],
}

impl GrpcPaths {
    /// One block of unary calls on path `index` (0..5: the gRPC paths,
    /// then HTTP direct and HTTP via the sidecar).
    async fn block(
        &mut self,
        index: usize,
        client: &HttpClient,
        samples: &mut [Vec<Duration>; 5],
    ) -> Result<()> {
        for _ in 0..GRPC_BLOCK {
            let took = if let Some((grpc, bucket)) = self.grpc.get_mut(index) {
                grpc_get(grpc, bucket).await?
            } else {
                let (took, body) = get_metadata(client, self.http[index - 3].clone()).await?;
                let bucket = if index == 3 { PHYSICAL } else { LOGICAL };
                check_bucket_field(&body, bucket)?;
                took
            };
            samples[index].push(took);
        }
        Ok(())
    }
}

/// GetObject latency and ReadObject / WriteObject throughput, direct to
/// the mock GCS, through the h2 relay and through a sidecar of its own,
/// the paths taking turns; the HTTP metadata GET through the same sidecar
/// in the same blocks.
pub(crate) async fn grpc_phase(
    settings: &Settings,
    client: &HttpClient,
    upstream: SocketAddr,
    dir: &Path,
    chunk: &Bytes,
) -> Result<GrpcFigures> {
    let size = settings.grpc_big;
    let mock = start_mock_gcs(size, chunk)?;
    let physical = std::env::var_os("BUCKETMAP_BENCH_GRPC_PHYSICAL").is_some_and(|v| v != "0");
    let (mut sidecar, sidecar_addr) =
        start_grpc_sidecar(client, upstream, mock, dir, physical).await?;
    let (mut relay, relay_addr) = start_h2_relay(mock, dir).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle_rss_kib = memory_kib(sidecar.pid())?.rss_kib;
    let via = if physical { PHYSICAL } else { LOGICAL };
    let mut paths = GrpcPaths {
        grpc: [
            (grpc_client(mock)?, PHYSICAL),
            (grpc_client(relay_addr)?, PHYSICAL),
            (grpc_client(sidecar_addr)?, via),
        ],
        http: [
            Endpoint::plain("direct", upstream, PHYSICAL).metadata(),
            Endpoint::plain("sidecar", sidecar_addr, LOGICAL).metadata(),
        ],
    };
    eprintln!(
        "[grpc] GetObject and the HTTP metadata GET: {} calls per path in blocks of {GRPC_BLOCK}, closed loop",
        settings.grpc_calls
    );
    let mut samples: [Vec<Duration>; 5] = Default::default();
    for index in 0..5 {
        paths.block(index, client, &mut samples).await?;
    }
    samples = Default::default();
    for block in 0..settings.grpc_calls.div_ceil(GRPC_BLOCK) as usize {
        for turn in 0..5 {
            paths
                .block((block + turn) % 5, client, &mut samples)
                .await?;
        }
    }
    let [d, r, s, hd, hs] = samples.map(|s| Latencies::new(s, Vec::new(), Vec::new()));
    let proxies = [None, Some(relay.pid()), Some(sidecar.pid())];
    let (rates, cpu_per_mib) = grpc_transfers(settings, &mut paths.grpc, proxies, chunk).await?;
    sidecar.check_running()?;
    relay.check_running()?;
    let hwm_kib = memory_kib(sidecar.pid())?.hwm_kib;
    Ok(GrpcFigures {
        calls: settings.grpc_calls.div_ceil(GRPC_BLOCK) * GRPC_BLOCK,
        size,
        latencies: [d, r, s],
        http: [hd, hs],
        rates,
        cpu_per_mib,
        idle_rss_kib,
        hwm_kib,
        physical,
    })
}

/// WriteObject and ReadObject of `settings.grpc_big` bytes on every path,
/// the paths taking turns: MiB/s per repetition, and the CPU time per MiB
/// of each path's proxy process (`proxies`) over all repetitions.
async fn grpc_transfers(
    settings: &Settings,
    paths: &mut [(GrpcClient, &'static str); 3],
    proxies: [Option<u32>; 3],
    chunk: &Bytes,
) -> Result<(Vec<(Direction, [Vec<f64>; 3])>, Vec<[Option<f64>; 3]>)> {
    let size = settings.grpc_big;
    let (mut rates, mut cpu) = (Vec::new(), Vec::new());
    for direction in [Direction::Upload, Direction::Download] {
        let what = transfer_name(direction);
        eprintln!(
            "[grpc] {what} of {} MiB, {} repetition(s) per path",
            size / MIB,
            settings.reps
        );
        let mut per_path: [Vec<f64>; 3] = Default::default();
        let mut cpu_ns = [0u64; 3];
        for rep in 0..settings.reps as usize {
            for turn in 0..3 {
                let index = (rep + turn) % 3;
                let (client, bucket) = &mut paths[index];
                let proxy_cpu =
                    || proxies[index].map_or(0, |pid| accounted_cpu_ns(&pid.to_string()));
                let before = proxy_cpu();
                let elapsed = match direction {
                    Direction::Upload => grpc_write(client, bucket, size, chunk).await?,
                    Direction::Download => grpc_read(client, bucket, size).await?,
                };
                cpu_ns[index] += proxy_cpu().saturating_sub(before);
                let rate = mib_per_s(size, elapsed);
                eprintln!(
                    "  {what} {}: {rate:.0} MiB/s ({elapsed:.2?})",
                    GRPC_PATHS[index]
                );
                per_path[index].push(rate);
            }
        }
        let mib_moved = (size * u64::from(settings.reps)) as f64 / MIB as f64;
        let per_mib = |i: usize| proxies[i].map(|_| cpu_ns[i] as f64 / 1e6 / mib_moved);
        cpu.push([per_mib(0), per_mib(1), per_mib(2)]);
        rates.push((direction, per_path));
    }
    Ok((rates, cpu))
}

/// The proxies' CPU per MiB, and the sidecar's over the relay's.
fn cpu_cell(cpu: &[Option<f64>; 3]) -> String {
    match (cpu[RELAY], cpu[SIDECAR]) {
        (Some(relay), Some(sidecar)) => format!(
            "{relay:.2} ms, {sidecar:.2} ms ({:.2}×)",
            ratio(sidecar, relay)
        ),
        _ => String::new(),
    }
}

fn transfer_name(direction: Direction) -> &'static str {
    match direction {
        Direction::Upload => "WriteObject",
        Direction::Download => "ReadObject",
    }
}

impl GrpcFigures {
    pub(crate) fn render(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "\n### gRPC (google.storage.v2 over h2c, the in-repo mock GCS)\n\nThe mock runs in the bench process on its own thread; the client is the generated tonic client over hyper h2c. Paths: direct, the **h2 relay** (an h2c server forwarding each stream over the sidecar's HTTP/2 upstream client, no logic: the floor of a gRPC proxy built on hyper) and the sidecar. Unary `GetObject` of a 595-byte object: {} sequential calls per path (closed loop) in blocks of {GRPC_BLOCK}, the paths taking turns with the JSON API's metadata GET of an object, direct to the in-process upstream and through the same sidecar process. `WriteObject` (2 MiB messages) and `ReadObject` (the mock's 2 MiB chunks) of {} MiB: median MiB/s (range) of the repetitions.\n",
            self.calls,
            self.size / MIB
        );
        if self.physical {
            let _ = writeln!(
                out,
                "Via the sidecar with `--allow-physical-names`, physical names: no name was rewritten.\n"
            );
        }
        self.render_latencies(out);
        self.render_rates(out);
        let _ = writeln!(
            out,
            "\nThe gRPC sidecar's RSS: {} idle, peak (`VmHWM`) {} after all of the above.",
            mib(self.idle_rss_kib),
            mib(self.hwm_kib)
        );
    }

    fn render_latencies(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "| call, path | p50 (added) | p90 (added) | p99 (added) | max |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|");
        let [direct, ..] = &self.latencies;
        let [http_direct, http_via] = &self.http;
        let rows = [
            ("GetObject, direct", &self.latencies[0], direct),
            ("GetObject, h2 relay", &self.latencies[RELAY], direct),
            ("GetObject, sidecar", &self.latencies[SIDECAR], direct),
            ("HTTP metadata GET, direct", http_direct, http_direct),
            ("HTTP metadata GET, sidecar", http_via, http_direct),
        ];
        for (label, lat, base) in rows {
            let mut row = format!("| {label} |");
            for p in [50.0, 90.0, 99.0] {
                let value = lat.percentile(p);
                let _ = write!(row, " {}", fmt_duration(value));
                if !std::ptr::eq(lat, base) {
                    let _ = write!(row, " ({})", fmt_added(value, base.percentile(p)));
                }
                row.push_str(" |");
            }
            let _ = writeln!(out, "{row} {} |", fmt_duration(lat.max()));
        }
        let added = |via: &Latencies, direct: &Latencies| {
            via.percentile(50.0).as_secs_f64() - direct.percentile(50.0).as_secs_f64()
        };
        let grpc = added(&self.latencies[SIDECAR], direct);
        let http = added(http_via, http_direct);
        let _ = writeln!(
            out,
            "\nAdded p50 of the sidecar, gRPC `GetObject` ÷ HTTP metadata GET: {:.2}× (target ≤ 1.00×: {}).",
            ratio(grpc, http),
            verdict(grpc <= http)
        );
    }

    fn render_rates(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "\n| transfer | direct | h2 relay | sidecar | sidecar ÷ h2 relay (target ≥ 90 %) | repetitions held | proxy CPU per MiB: h2 relay, sidecar (sidecar ÷ relay) |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|");
        let cell = |values: &[f64]| {
            let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = values.iter().copied().fold(0.0, f64::max);
            if values.len() > 1 {
                format!("{:.0} MiB/s ({lo:.0}–{hi:.0})", median(values))
            } else {
                format!("{:.0} MiB/s", median(values))
            }
        };
        for ((direction, rates), cpu) in self.rates.iter().zip(&self.cpu_per_mib) {
            let r = ratio(median(&rates[SIDECAR]), median(&rates[RELAY]));
            // Each repetition ran the paths one after the other: judged on
            // its own pair, the target is decided when every repetition
            // agrees, within the machine's noise when they split.
            let pairs = rates[SIDECAR].iter().zip(&rates[RELAY]);
            let held = pairs.filter(|&(s, r)| *s >= 0.9 * *r).count();
            let _ = writeln!(
                out,
                "| {} {} MiB | {} | {} | {} | {:.1} % ({}) | {held} of {} | {} |",
                transfer_name(*direction),
                self.size / MIB,
                cell(&rates[0]),
                cell(&rates[RELAY]),
                cell(&rates[SIDECAR]),
                r * 100.0,
                verdict(r >= 0.9),
                rates[SIDECAR].len().min(rates[RELAY].len()),
                cpu_cell(cpu),
            );
        }
    }
}
