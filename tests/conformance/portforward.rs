//! `pods/{name}/portforward` through kube's `Api::<Pod>::portforward` (WebSocket,
//! v4.channel.k8s.io): bytes reach a real TCP server behind the pod and come back,
//! the server's close ends the stream, a missing pod is a 404 and a pod whose
//! port leads nowhere reports on the port's error channel. The target is the test
//! world's: skipped when `KUBECONFIG` is set.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::*;

fn pod(name: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"app": "etcd-proxy"}},
        "spec": {"nodeName": "n1", "hostNetwork": true,
                 "containers": [{"name": "proxy", "image": "proxy"}]}
    }))
    .unwrap()
}

#[tokio::test]
async fn a_port_forward_tunnels_bytes_to_the_pods_target_both_ways() {
    run("portforward-echo", |env| async move {
        let Some(server) = env.server.as_ref() else {
            eprintln!("skipped against a real cluster: the tunnel target is the test world's");
            return;
        };
        // A real TCP echo server that closes after one exchange.
        let echo = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let echo_addr = echo.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut conn, _) = echo.accept().await.unwrap();
            let mut buf = [0u8; 5];
            conn.read_exact(&mut buf).await.unwrap();
            conn.write_all(&[b"echo:".as_slice(), &buf].concat())
                .await
                .unwrap();
        });
        let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
        pods.create(&PostParams::default(), &pod("proxy-1"))
            .await
            .unwrap();
        server.set_port_forward_target(&env.ns, "proxy-1", 2379, echo_addr);
        assert_eq!(server.port_forwards_opened(&env.ns, "proxy-1"), 0);

        let mut forwarder = pods.portforward("proxy-1", &[2379]).await.unwrap();
        let mut stream = forwarder.take_stream(2379).unwrap();
        stream.write_all(b"hello").await.unwrap();
        let mut answer = Vec::new();
        // The echo server closes after answering: the stream ends (read_to_end
        // returns) instead of hanging.
        tokio::time::timeout(DEADLINE, stream.read_to_end(&mut answer))
            .await
            .expect("the stream ends when the target closes")
            .unwrap();
        assert_eq!(answer, b"echo:hello");
        assert_eq!(server.port_forwards_opened(&env.ns, "proxy-1"), 1);
    })
    .await;
}

#[tokio::test]
async fn a_missing_pod_is_not_found_and_a_dead_target_reports_on_the_error_channel() {
    run("portforward-errors", |env| async move {
        let Some(server) = env.server.as_ref() else {
            eprintln!("skipped against a real cluster: the tunnel target is the test world's");
            return;
        };
        let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
        let err = pods.portforward("absent", &[2379]).await.err().unwrap();
        assert!(
            matches!(&err, kube::Error::Api(s) if s.code == 404),
            "{err:?}"
        );

        // A port nothing listens on.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dead = closed.local_addr().unwrap();
        drop(closed);
        pods.create(&PostParams::default(), &pod("proxy-2"))
            .await
            .unwrap();
        server.set_port_forward_target(&env.ns, "proxy-2", 2379, dead);
        let mut forwarder = pods.portforward("proxy-2", &[2379]).await.unwrap();
        let error = forwarder.take_error(2379).unwrap();
        let message = tokio::time::timeout(DEADLINE, error)
            .await
            .expect("the error channel answers")
            .expect("an error message");
        assert!(
            message.contains("proxy-2") && message.contains(&dead.to_string()),
            "{message}"
        );
    })
    .await;
}
