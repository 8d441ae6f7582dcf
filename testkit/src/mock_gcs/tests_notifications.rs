//! The JSON API's notification configurations as the mock models them
//! after GCS: what it fills in, what it refuses and how it answers, over
//! HTTP/1.1 on the gRPC port, while gRPC keeps working there.

use serde_json::{Value, json};

use super::tests::client;
use super::{MockGcs, proto};
use crate::http::request;

const TOPIC: &str = "projects/acme-staging/topics/uploads";

async fn mock_with_bucket() -> anyhow::Result<MockGcs> {
    let mock = MockGcs::start().await?;
    let bucket = proto::Bucket {
        bucket_id: "photos-k3x9q2mw".into(),
        ..Default::default()
    };
    mock.handle().insert_bucket("acme-staging", bucket)?;
    mock.handle().add_topic(TOPIC);
    Ok(mock)
}

async fn call(mock: &MockGcs, method: &str, tail: &str, body: &Value) -> (u16, Value) {
    let addr = mock.addr().to_string();
    let path = format!("/storage/v1/b/photos-k3x9q2mw/notificationConfigs{tail}");
    let text = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let (status, answer) = request(&addr, method, &path, &text)
        .await
        .expect("the mock answers");
    (status, serde_json::from_str(&answer).unwrap_or(Value::Null))
}

fn config(topic: &str) -> Value {
    json!({"topic": format!("//pubsub.googleapis.com/{topic}"), "payload_format": "JSON_API_V1"})
}

#[tokio::test]
async fn an_inserted_configuration_gets_an_id_and_is_listed_until_deleted() -> anyhow::Result<()> {
    let mock = mock_with_bucket().await?;
    let (status, list) = call(&mock, "GET", "", &Value::Null).await;
    assert_eq!(status, 200);
    assert_eq!(
        list,
        json!({"kind": "storage#notifications"}),
        "no items when empty"
    );
    let mut asked = config(TOPIC);
    asked["event_types"] = json!(["OBJECT_FINALIZE"]);
    asked["custom_attributes"] = json!({"team": "a"});
    let (status, made) = call(&mock, "POST", "", &asked).await;
    assert_eq!(status, 200, "{made}");
    assert_eq!(made["kind"], "storage#notification");
    let id = made["id"].as_str().expect("an id").to_owned();
    assert!(
        made["etag"].is_string() && made["selfLink"].as_str().is_some_and(|l| l.ends_with(&id))
    );
    assert_eq!(made["event_types"], asked["event_types"]);
    assert_eq!(made["custom_attributes"], asked["custom_attributes"]);
    let (_, list) = call(&mock, "GET", "", &Value::Null).await;
    assert_eq!(list["items"], json!([made.clone()]));
    let (status, got) = call(&mock, "GET", &format!("/{id}"), &Value::Null).await;
    assert_eq!((status, got), (200, made));
    let (status, _) = call(&mock, "DELETE", &format!("/{id}"), &Value::Null).await;
    assert_eq!(status, 204);
    let (status, _) = call(&mock, "DELETE", &format!("/{id}"), &Value::Null).await;
    assert_eq!(status, 404);
    assert_eq!(mock.handle().call_count("CreateNotificationConfig"), 1);
    // gRPC still works on the same port.
    let c = client(&mock).await?;
    let bucket = c
        .get_bucket()
        .set_name("projects/_/buckets/photos-k3x9q2mw")
        .send()
        .await?;
    assert_eq!(bucket.bucket_id, "photos-k3x9q2mw");
    Ok(())
}

#[tokio::test]
async fn the_mock_refuses_what_gcs_refuses() -> anyhow::Result<()> {
    let mock = mock_with_bucket().await?;
    let short = json!({"topic": TOPIC, "payload_format": "NONE"});
    let missing = config("projects/acme-staging/topics/nowhere");
    let mut bad_event = config(TOPIC);
    bad_event["event_types"] = json!(["OBJECT_CREATE"]);
    let cases = [
        (
            short,
            "It should look like '//pubsub.googleapis.com/projects/*/topics/*'",
        ),
        (
            missing,
            "not found, or user 'service-acme-staging@gs-project-accounts.iam.gserviceaccount.com' does not have permission to it",
        ),
        (
            json!({"topic": config(TOPIC)["topic"]}),
            "Required: payload_format",
        ),
        (bad_event, "Invalid event type: OBJECT_CREATE"),
    ];
    for (body, message) in cases {
        let (status, answer) = call(&mock, "POST", "", &body).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(answer["error"]["errors"][0]["reason"], "invalid");
        let said = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(said.contains(message), "{body}: {said}");
    }
    assert!(mock.handle().notifications("photos-k3x9q2mw").is_empty());
    Ok(())
}

#[tokio::test]
async fn at_most_ten_configurations_trigger_for_one_event() -> anyhow::Result<()> {
    let mock = mock_with_bucket().await?;
    for _ in 0..10 {
        let mut body = config(TOPIC);
        body["event_types"] = json!(["OBJECT_DELETE"]);
        assert_eq!(call(&mock, "POST", "", &body).await.0, 200);
    }
    let mut other = config(TOPIC);
    other["event_types"] = json!(["OBJECT_FINALIZE"]);
    assert_eq!(call(&mock, "POST", "", &other).await.0, 200);
    let (status, answer) = call(&mock, "POST", "", &config(TOPIC)).await;
    assert_eq!(status, 400, "all events include OBJECT_DELETE: {answer}");
    Ok(())
}

#[tokio::test]
async fn configurations_go_with_their_bucket() -> anyhow::Result<()> {
    let mock = mock_with_bucket().await?;
    assert_eq!(call(&mock, "POST", "", &config(TOPIC)).await.0, 200);
    mock.handle().remove_bucket("photos-k3x9q2mw");
    let (status, _) = call(&mock, "GET", "", &Value::Null).await;
    assert_eq!(status, 404);
    let again = proto::Bucket {
        bucket_id: "photos-k3x9q2mw".into(),
        ..Default::default()
    };
    mock.handle().insert_bucket("acme-staging", again)?;
    assert!(mock.handle().notifications("photos-k3x9q2mw").is_empty());
    Ok(())
}
