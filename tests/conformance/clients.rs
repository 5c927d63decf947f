//! What other clients send and ask, beyond kube-rs: the root path list that
//! Cluster API's ClusterCache probes (`GET /`), and the protobuf
//! `DeleteOptions` body controller-runtime sends when it deletes a built-in
//! kind (Cluster API's Machine controller deleting a Node).

use kube::ResourceExt;
use kube::api::PostParams;
use serde_json::Value;

use crate::support::*;

#[tokio::test]
async fn the_root_path_lists_the_api_paths() {
    run("root-paths", |env| async move {
        let request = http::Request::get("/").body(Vec::new()).unwrap();
        let doc: Value = env.client.request(request).await.expect("GET / answers");
        let paths: Vec<&str> = doc["paths"]
            .as_array()
            .expect("a paths list")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for path in ["/api", "/api/v1", "/apis", "/version"] {
            assert!(paths.contains(&path), "{path} in {paths:?}");
        }
    })
    .await;
}

fn bytes_field(field: u8, data: &[u8]) -> Vec<u8> {
    assert!(data.len() < 128);
    let mut out = vec![(field << 3) | 2, data.len() as u8];
    out.extend_from_slice(data);
    out
}

/// `DeleteOptions{preconditions: {uid}}` as client-go's protobuf serializer
/// writes it: the `k8s\0` magic and a `runtime.Unknown` around the message.
fn protobuf_delete_options(uid: &str) -> Vec<u8> {
    let raw = bytes_field(2, &bytes_field(1, uid.as_bytes()));
    let type_meta = [bytes_field(1, b"v1"), bytes_field(2, b"DeleteOptions")].concat();
    let unknown = [
        bytes_field(1, &type_meta),
        bytes_field(2, &raw),
        bytes_field(3, b""),
        bytes_field(4, b""),
    ]
    .concat();
    [b"k8s\0".as_slice(), &unknown].concat()
}

#[tokio::test]
async fn a_protobuf_delete_options_body_is_read() {
    run("protobuf-delete", |env| async move {
        let created = env
            .config_maps()
            .create(&PostParams::default(), &config_map("cm", &[]))
            .await
            .unwrap();
        let delete = |uid: &str| {
            http::Request::delete(format!("/api/v1/namespaces/{}/configmaps/cm", env.ns))
                .header(
                    http::header::CONTENT_TYPE,
                    "application/vnd.kubernetes.protobuf",
                )
                .header(http::header::ACCEPT, "application/json")
                .body(protobuf_delete_options(uid))
                .unwrap()
        };
        // The precondition is read: a wrong uid is a conflict.
        let status = status_of(env.client.request::<Value>(delete("not-the-uid")).await);
        assert_eq!(status.code, 409, "{status:?}");
        assert!(env.config_maps().get_opt("cm").await.unwrap().is_some());
        env.client
            .request::<Value>(delete(&created.uid().unwrap()))
            .await
            .expect("the delete with the right uid succeeds");
        assert!(env.config_maps().get_opt("cm").await.unwrap().is_none());
    })
    .await;
}
