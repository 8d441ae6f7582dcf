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

mod common;

use common::checks::Checks;
use common::gcsfs::{check_same_steps, check_sidecar_side, run_gcsfs};
use common::rclone::{check_rclone_sidecar_side, check_same_outcomes, run_rclone};
use common::report::{check_report, check_upstream};
use common::scenario::{Client, Scenario, run_client};
use common::world::FORBIDDEN;
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

#[test]
fn gcsfs_through_sidecar_does_what_it_does_directly() {
    let direct = World::direct("gcsfs-direct").expect("start fake-gcs-server");
    let world =
        World::through_sidecar("gcsfs", &[]).expect("start fake-gcs-server and the sidecar");
    let mut checks = Checks::default();
    match (run_gcsfs(&direct), run_gcsfs(&world)) {
        (Ok((want, _)), Ok((got, raw))) => {
            check_same_steps(&mut checks, &want, &got);
            if let Err(e) = check_sidecar_side(&mut checks, &world, &got, &raw) {
                checks.fail(format!("cannot read the upstream state: {e:#}"));
            }
        }
        (Err(e), _) => checks.fail(format!("directly: {e:#}")),
        (_, Err(e)) => checks.fail(format!("through the sidecar: {e:#}")),
    }
    checks.finish("gcsfs through the sidecar", &world.diagnostics());
}

#[test]
fn rclone_through_sidecar_does_what_it_does_directly() {
    let direct = World::direct("rclone-direct").expect("start fake-gcs-server");
    let world =
        World::through_sidecar("rclone", &[]).expect("start fake-gcs-server and the sidecar");
    let mut checks = Checks::default();
    let physical = world.physical("photos").to_owned();
    match (
        run_rclone(&direct, FORBIDDEN[1]),
        run_rclone(&world, &physical),
    ) {
        (Ok((want, _, _)), Ok((got, own, raw))) => {
            check_same_outcomes(&mut checks, &want, &got);
            if let Err(e) = check_rclone_sidecar_side(&mut checks, &world, &own, &raw) {
                checks.fail(format!("cannot read the upstream state: {e:#}"));
            }
        }
        (Err(e), _) => checks.fail(format!("directly: {e:#}")),
        (_, Err(e)) => checks.fail(format!("through the sidecar: {e:#}")),
    }
    checks.finish("rclone through the sidecar", &world.diagnostics());
}
