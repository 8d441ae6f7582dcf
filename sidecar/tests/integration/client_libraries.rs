//! Real GCS client libraries (Python google-cloud-storage, Go
//! cloud.google.com/go/storage, Node @google-cloud/storage, Java
//! com.google.cloud:google-cloud-storage with its default gzipped request
//! bodies, and the Rust SDK's `Storage`) run a scenario with logical bucket
//! names through the sidecar; the test checks what each client saw and what
//! landed in the physical buckets upstream. The Rust SDK's `Storage` only
//! reads and writes objects (small single-shot writes, a resumable write of
//! more than 16 MiB, full and ranged reads); the rest of that SDK is gRPC.
//!
//! The `*_direct` tests run the same scenario straight against
//! fake-gcs-server (logical == physical): they prove the client programs, the
//! pinned installs and the emulator work on their own, so a failure in the
//! sidecar test is the sidecar's.
//!
//! gcsfs, the Python filesystem most data tools reach GCS through, speaks
//! the JSON API with its own client: it runs the same operations through the
//! sidecar and directly, and every outcome must be the same. So does
//! rclone, whose GCS backend is Google's generated Go JSON API client.
//!
//! The client installs are cached (see sidecar/tests/clients/install.sh);
//! the first run builds them from the registries.

use crate::common;

use common::checks::{Checks, check_same_outcomes};
use common::gcsfs::{self, check_sidecar_side, run_gcsfs};
use common::rclone::{self, check_rclone_sidecar_side, run_rclone};
use common::report::{check_report, check_upstream};
use common::scenario::{Client, Scenario, run_client};
use common::world::World;

fn run(client: Client, world: World) {
    let title = format!(
        "{} client {}",
        client.name(),
        if world.sidecar.is_some() {
            "through the sidecar"
        } else {
            "against fake-gcs-server directly"
        }
    );
    let scenario = Scenario::write(world.dir(), world.map()).expect("write the scenario");
    let endpoint = world.endpoint();
    let mut checks = Checks::default();
    let direct = world.sidecar.is_none();
    match run_client(client, &endpoint, &scenario, world.dir(), direct) {
        Ok(report) => {
            if let Err(e) = check_report(
                &mut checks,
                client,
                &scenario,
                &report,
                &endpoint,
                &world.leaks(),
            ) {
                checks.fail(format!("cannot check the report: {e:#}"));
            }
        }
        Err(e) => checks.fail(format!("{e:#}")),
    }
    if let Err(e) = check_upstream(&mut checks, &world, client, &scenario) {
        checks.fail(format!("cannot read the upstream state: {e:#}"));
    }
    checks.finish(&title, &world.diagnostics());
}

fn through_sidecar(client: Client) {
    let world = World::through_sidecar(&format!("clients-{}", client.name()), &[])
        .expect("start fake-gcs-server and the sidecar");
    run(client, world);
}

fn direct(client: Client) {
    let world = World::direct(&format!("direct-{}", client.name())).expect("start fake-gcs-server");
    run(client, world);
}

#[test]
fn python_client_through_sidecar() {
    through_sidecar(Client::Python);
}

#[test]
fn go_client_through_sidecar() {
    through_sidecar(Client::Go);
}

#[test]
fn node_client_through_sidecar() {
    through_sidecar(Client::Node);
}

#[test]
fn python_client_direct() {
    direct(Client::Python);
}

#[test]
fn go_client_direct() {
    direct(Client::Go);
}

#[test]
fn node_client_direct() {
    direct(Client::Node);
}

#[test]
fn java_client_through_sidecar() {
    through_sidecar(Client::Java);
}

#[test]
fn java_client_direct() {
    direct(Client::Java);
}

#[test]
fn rust_client_through_sidecar() {
    through_sidecar(Client::Rust);
}

#[test]
fn rust_client_direct() {
    direct(Client::Rust);
}

/// Runs a tool straight against fake-gcs-server and through the sidecar
/// (`run`), then judges both runs (`check`: an `Err` is a failure to read
/// the upstream).
fn differential<R>(
    tool: &str,
    run: impl Fn(&World) -> anyhow::Result<R>,
    check: impl FnOnce(&mut Checks, &World, R, R) -> anyhow::Result<()>,
) {
    let direct = World::direct(&format!("{tool}-direct")).expect("start fake-gcs-server");
    let world = World::through_sidecar(tool, &[]).expect("start fake-gcs-server and the sidecar");
    let mut checks = Checks::default();
    match (run(&direct), run(&world)) {
        (Ok(want), Ok(got)) => {
            if let Err(e) = check(&mut checks, &world, want, got) {
                checks.fail(format!("cannot read the upstream state: {e:#}"));
            }
        }
        (Err(e), _) => checks.fail(format!("directly: {e:#}")),
        (_, Err(e)) => checks.fail(format!("through the sidecar: {e:#}")),
    }
    checks.finish(&format!("{tool} through the sidecar"), &world.diagnostics());
}

#[test]
fn gcsfs_through_sidecar_does_what_it_does_directly() {
    differential(
        "gcsfs",
        run_gcsfs,
        |checks, world, (want, _), (got, raw)| {
            check_same_outcomes(checks, &gcsfs::steps(&want), &gcsfs::steps(&got), 25);
            check_sidecar_side(checks, world, &got, &raw)
        },
    );
}

#[test]
fn rclone_through_sidecar_does_what_it_does_directly() {
    differential(
        "rclone",
        run_rclone,
        |checks, world, (want, _, _), (got, own, raw)| {
            check_same_outcomes(checks, &want, &got, rclone::STEPS.len());
            check_rclone_sidecar_side(checks, world, &own, &raw)
        },
    );
}
