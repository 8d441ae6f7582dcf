//! The copy's passes against the mock GCS, through the official client.

use std::sync::Arc;
use std::time::Duration;

use bucketmap_testkit::mock_gcs::{MockGcs, MockHandle, proto};

use super::{Copier, Pass};
use crate::gcs::{GcsClient, GcsConfig};
use crate::metrics::Metrics;

const SOURCE: &str = "photos-src00001";
const DESTINATION: &str = "photos-dst00001";

struct World {
    _mock: MockGcs,
    handle: MockHandle,
    gcs: GcsClient,
}

impl World {
    async fn new() -> World {
        let mock = MockGcs::start().await.expect("the GCS mock starts");
        let handle = mock.handle();
        for (project, id) in [("acme-us", SOURCE), ("acme-eu", DESTINATION)] {
            let bucket = proto::Bucket {
                bucket_id: id.to_owned(),
                location: if project == "acme-us" { "US" } else { "EU" }.to_owned(),
                ..Default::default()
            };
            handle.insert_bucket(project, bucket).expect("a bucket");
        }
        let config = GcsConfig {
            endpoint: Some(mock.endpoint()),
            anonymous: true,
        };
        let gcs = GcsClient::connect(&config, Arc::new(Metrics::default()))
            .await
            .expect("a client of the mock");
        World {
            _mock: mock,
            handle,
            gcs,
        }
    }

    fn copier(&self) -> Copier<'_> {
        Copier {
            gcs: &self.gcs,
            source: SOURCE,
            destination: DESTINATION,
            concurrency: 4,
            max_bytes_per_call: 0,
            page_size: 7,
        }
    }

    fn put(&self, bucket: &str, name: &str, data: &str) -> proto::Object {
        self.handle
            .put_object_data(bucket, name, data.to_owned())
            .expect("an object")
    }

    fn data(&self, bucket: &str, name: &str) -> Option<String> {
        let data = self.handle.object_data(bucket, name)?;
        Some(String::from_utf8_lossy(&data).into_owned())
    }

    /// The live objects of `bucket`: name, size, CRC32C.
    fn live(&self, bucket: &str) -> Vec<(String, i64, Option<u32>)> {
        self.handle
            .objects(bucket)
            .into_iter()
            .filter(|o| o.delete_time.is_none())
            .map(|o| (o.name, o.size, o.checksums.and_then(|c| c.crc32c)))
            .collect()
    }
}

#[tokio::test]
async fn passes_copy_then_converge_and_follow_changes_and_deletions() {
    let w = World::new().await;
    for i in 0..30 {
        w.put(SOURCE, &format!("album/{i:02}.jpg"), &format!("photo {i}"));
    }
    w.put(DESTINATION, "stray.txt", "not in the source");
    let first = w.copier().pass().await.expect("a pass");
    assert_eq!(
        (first.objects, first.copied, first.pruned, first.same),
        (30, 30, 1, 0)
    );
    assert_eq!(w.live(SOURCE), w.live(DESTINATION));
    assert_eq!(
        w.data(DESTINATION, "album/07.jpg").as_deref(),
        Some("photo 7")
    );

    let second = w.copier().pass().await.expect("a pass");
    assert!(second.converged(), "{second:?}");
    assert_eq!(second.same, 30);

    w.put(SOURCE, "album/03.jpg", "photo 3, edited");
    w.put(SOURCE, "album/99.jpg", "a new one");
    w.handle.modify_objects(SOURCE, "album/05.jpg", |o| {
        o.metadata.insert("caption".into(), "a new caption".into());
    });
    let gone = w.handle.objects(SOURCE);
    let gone = gone.iter().find(|o| o.name == "album/11.jpg").expect("11");
    w.gcs
        .delete_object(SOURCE, &gone.name, gone.generation)
        .await
        .expect("deleted");
    let third = w.copier().pass().await.expect("a pass");
    assert_eq!(
        (third.copied, third.pruned, third.raced),
        (3, 1, 0),
        "{third:?}"
    );
    assert_eq!(w.live(SOURCE), w.live(DESTINATION));
    assert_eq!(
        w.data(DESTINATION, "album/03.jpg").as_deref(),
        Some("photo 3, edited")
    );
    let copied = w.handle.objects(DESTINATION);
    let five = copied
        .iter()
        .find(|o| o.name == "album/05.jpg")
        .expect("05");
    assert_eq!(
        five.metadata.get("caption").map(String::as_str),
        Some("a new caption")
    );
    assert!(w.copier().pass().await.expect("a pass").converged());
}

#[tokio::test]
async fn an_object_changed_while_the_pass_copies_it_is_raced_never_overwritten() {
    let w = World::new().await;
    w.put(SOURCE, "a.txt", "first");
    w.handle
        .set_latency(Some("RewriteObject".into()), Duration::from_millis(400));
    let pass = {
        let copier = w.copier();
        let pass = copier.pass();
        let edit = async {
            tokio::time::sleep(Duration::from_millis(150)).await;
            w.put(SOURCE, "a.txt", "second");
        };
        let (pass, ()) = tokio::join!(pass, edit);
        pass.expect("a pass")
    };
    assert_eq!((pass.copied, pass.raced), (0, 1), "{pass:?}");
    assert_eq!(w.data(DESTINATION, "a.txt"), None);

    // The destination changes under the pass: the copy over it is refused.
    w.copier().pass().await.expect("a pass");
    w.put(SOURCE, "a.txt", "third");
    let pass = {
        let copier = w.copier();
        let edit = async {
            tokio::time::sleep(Duration::from_millis(150)).await;
            w.put(DESTINATION, "a.txt", "written in the destination");
        };
        let (pass, ()) = tokio::join!(copier.pass(), edit);
        pass.expect("a pass")
    };
    assert_eq!((pass.copied, pass.raced), (0, 1), "{pass:?}");
    assert_eq!(
        w.data(DESTINATION, "a.txt").as_deref(),
        Some("written in the destination")
    );
}

#[tokio::test]
async fn holds_and_the_metadata_a_copy_carries_are_on_the_copy() {
    let w = World::new().await;
    w.put(SOURCE, "held.txt", "keep me");
    w.put(SOURCE, "plain.txt", "plain");
    w.handle.modify_objects(SOURCE, "held.txt", |o| {
        o.temporary_hold = true;
        o.content_type = "text/plain".into();
        o.cache_control = "no-store".into();
        o.metadata.insert("owner".into(), "ada".into());
    });
    let pass: Pass = w.copier().pass().await.expect("a pass");
    assert_eq!(pass.copied, 2);
    let copies = w.handle.objects(DESTINATION);
    let held = copies.iter().find(|o| o.name == "held.txt").expect("held");
    assert!(held.temporary_hold, "{held:?}");
    assert_eq!(
        (held.content_type.as_str(), held.cache_control.as_str()),
        ("text/plain", "no-store")
    );
    assert_eq!(held.metadata.get("owner").map(String::as_str), Some("ada"));
    let plain = copies
        .iter()
        .find(|o| o.name == "plain.txt")
        .expect("plain");
    assert!(!plain.temporary_hold);
    assert!(w.copier().pass().await.expect("a pass").converged());
}

#[tokio::test]
async fn a_large_object_to_another_location_is_copied_in_calls_and_verified() {
    let w = World::new().await;
    let data: String = (0..(5 << 19))
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    w.put(SOURCE, "big.bin", &data);
    w.handle.reset_calls();
    let pass = w.copier().pass().await.expect("a pass");
    assert_eq!((pass.copied, pass.copied_bytes), (1, 5 << 19));
    // 2.5 MiB between locations, at the mock's 1 MiB per call.
    assert_eq!(w.handle.call_count("RewriteObject"), 3);
    assert_eq!(
        w.data(DESTINATION, "big.bin").as_deref(),
        Some(data.as_str())
    );
    assert_eq!(w.live(SOURCE), w.live(DESTINATION));
}
