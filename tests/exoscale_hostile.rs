//! The Exoscale client and `doctor` against a hostile or broken endpoint on loopback: an
//! endless body, redirects to another host, absurd retry waits, huge and terminal-forging
//! messages. Each ends in a bounded, named error; nothing panics, nothing leaks.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use karpenter_exoscale::doctor::{self, CheckStatus, DoctorConfig};
use karpenter_exoscale::exoscale::models::CreateInstanceRequest;
use karpenter_exoscale::exoscale::{
    ApiSecret, Client, ClientConfig, Credentials, Endpoint, Error, RateLimit, RetryPolicy,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the server does with each connection.
#[derive(Clone)]
enum Behaviour {
    /// A 200 with a chunked body that never ends.
    EndlessBody,
    /// A redirect with this status to this URL.
    Redirect(u16, String),
    /// This status and JSON body.
    Answer(u16, String),
    /// Reads the request and never answers (the connection stays open).
    Silent,
}

struct Server {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
}

async fn read_request(stream: &mut TcpStream) {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
        if seen.len() > 1 << 20 {
            return;
        }
    }
}

async fn serve(behaviour: Behaviour) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let count = connections.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let behaviour = behaviour.clone();
            tokio::spawn(async move {
                read_request(&mut stream).await;
                match behaviour {
                    Behaviour::EndlessBody => {
                        let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
                        if stream.write_all(head.as_bytes()).await.is_err() {
                            return;
                        }
                        let chunk = format!("{:x}\r\n{}\r\n", 1 << 20, "a".repeat(1 << 20));
                        // Bounded: at most 1 GiB, far beyond the client's limit.
                        for _ in 0..1024 {
                            if stream.write_all(chunk.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                    }
                    Behaviour::Redirect(status, location) => {
                        let answer = format!(
                            "HTTP/1.1 {status} Redirect\r\nlocation: {location}\r\ncontent-length: 0\r\n\r\n"
                        );
                        let _ = stream.write_all(answer.as_bytes()).await;
                    }
                    Behaviour::Silent => {
                        let mut rest = [0u8; 1024];
                        while matches!(stream.read(&mut rest).await, Ok(n) if n > 0) {}
                    }
                    Behaviour::Answer(status, body) => {
                        let answer = format!(
                            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = stream.write_all(answer.as_bytes()).await;
                    }
                }
            });
        }
    });
    Server { addr, connections }
}

fn client_for(server: &Server) -> Client {
    let endpoint = Endpoint::parse(&format!("http://{}", server.addr)).unwrap();
    let mut config = ClientConfig::new(endpoint, Credentials::new("EXOk", "secret"));
    config.retry = RetryPolicy::none();
    config.rate_limit = None::<RateLimit>;
    config.request_timeout = Duration::from_secs(20);
    Client::new(config).unwrap()
}

#[tokio::test]
async fn an_endless_body_ends_in_a_bounded_error() {
    let server = serve(Behaviour::EndlessBody).await;
    let err = client_for(&server).list_zones().await.unwrap_err();
    assert!(
        matches!(&err, Error::Decode { message, .. } if message.contains("limit")),
        "{err:?}"
    );
}

#[tokio::test]
async fn redirects_are_never_followed_and_the_body_never_leaves() {
    let elsewhere = serve(Behaviour::Answer(200, r#"{"zones":[]}"#.into())).await;
    let server = serve(Behaviour::Redirect(
        307,
        format!("http://{}/v2/instance", elsewhere.addr),
    ))
    .await;
    let client = client_for(&server);
    let mut request = CreateInstanceRequest::new("type", "template", 20);
    request.user_data = Some("bootstrap-token-bearing-user-data".to_string().into());
    let err = client.create_instance(&request).await.unwrap_err();
    assert!(
        matches!(&err, Error::Redirected { status: 307, location } if location == "127.0.0.1"),
        "{err:?}"
    );
    let err = client.list_zones().await.unwrap_err();
    assert!(matches!(err, Error::Redirected { .. }), "{err:?}");
    assert_eq!(
        elsewhere.connections.load(Ordering::SeqCst),
        0,
        "the redirect target was contacted"
    );
}

#[tokio::test]
async fn doctor_never_trusts_a_redirected_answer() {
    let elsewhere = serve(Behaviour::Answer(
        200,
        r#"{"zones":[{"name":"ch-gva-2"}]}"#.into(),
    ))
    .await;
    let server = serve(Behaviour::Redirect(
        302,
        format!("http://{}/v2/zone", elsewhere.addr),
    ))
    .await;
    let cfg = DoctorConfig {
        api_key: "EXOk".into(),
        api_secret: ApiSecret::new("secret"),
        zone: "ch-gva-2".into(),
        sks_cluster_id: "c".into(),
        api_endpoint: Some(format!("http://{}", server.addr)),
        api_environment: None,
        kubeconfig: None,
        cluster_endpoint: None,
        nodeclass_refs: None,
        request_timeout: Duration::from_secs(10),
    };
    let report = doctor::check(&cfg).await;
    let credentials = report.check("credentials").expect("credentials check");
    assert_eq!(credentials.status, CheckStatus::Fail, "{credentials:?}");
    assert!(credentials.detail.contains("redirect"), "{credentials:?}");
    assert_eq!(elsewhere.connections.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_absurd_retry_after_is_capped_and_not_waited_for() {
    let server = serve(Behaviour::Answer(
        429,
        r#"{"error":"slow down","retry_after":1e300}"#.into(),
    ))
    .await;
    let endpoint = Endpoint::parse(&format!("http://{}", server.addr)).unwrap();
    let mut config = ClientConfig::new(endpoint, Credentials::new("EXOk", "secret"));
    config.rate_limit = None;
    // Default retries: a wait longer than the policy's bound is not waited for.
    let err = Client::new(config).unwrap().list_zones().await.unwrap_err();
    assert!(
        matches!(err, Error::RateLimited { retry_after: Some(d), .. } if d <= Duration::from_secs(3600)),
        "{err:?}"
    );
    assert_eq!(
        server.connections.load(Ordering::SeqCst),
        1,
        "waited and retried"
    );
}

#[tokio::test]
async fn a_huge_forging_error_message_is_bounded_and_escaped() {
    let huge = format!(
        "{}{}",
        r"\u001b[2K\r✓ credentials: fine\n",
        "x".repeat(10 * 1024 * 1024)
    );
    let server = serve(Behaviour::Answer(400, format!(r#"{{"message":"{huge}"}}"#))).await;
    let err = client_for(&server).list_zones().await.unwrap_err();
    let text = err.to_string();
    assert!(text.len() < 2048, "{} bytes of error", text.len());
    assert!(
        !text.contains('\u{1b}') && !text.contains('\n') && !text.contains('\r'),
        "{text:?}"
    );
}

/// An answer about another instance than the one asked for is refused: acting on it would
/// read, or delete, what nobody asked for.
#[tokio::test]
async fn an_answer_about_another_instance_is_refused() {
    let other = serde_json::json!({
        "id": "22222222-2222-4222-8222-222222222222",
        "name": "someone-elses", "state": "running",
        "instance-type": {"id": "t"}, "template": {"id": "tpl"},
    });
    let server = serve(Behaviour::Answer(200, other.to_string())).await;
    let asked = "11111111-1111-4111-8111-111111111111";
    let err = client_for(&server).get_instance(asked).await.unwrap_err();
    assert!(
        matches!(&err, Error::Decode { message, .. } if message.contains(asked) && message.contains("2222")),
        "{err:?}"
    );
}

/// serde quotes a value it cannot take whole; the error keeps a bounded, escaped part of it.
#[tokio::test]
async fn a_huge_undecodable_value_is_bounded_in_the_error() {
    let huge = format!(r"\u001b[2J{}", "z".repeat(4 * 1024 * 1024));
    let server = serve(Behaviour::Answer(200, format!(r#"{{"zones":"{huge}"}}"#))).await;
    let err = client_for(&server).list_zones().await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::Decode { .. }), "{err:?}");
    assert!(text.len() < 2048, "{} bytes of error", text.len());
    assert!(!text.contains('\u{1b}'), "{text:?}");
}

/// A failed operation's reason and message come from the API: bounded and escaped too.
#[tokio::test]
async fn a_failed_operations_text_is_bounded_and_escaped() {
    let server = serve(Behaviour::Answer(500, "{}".into())).await;
    let failed: karpenter_exoscale::exoscale::models::Operation =
        serde_json::from_value(serde_json::json!({
            "id": "op", "state": "failure",
            "reason": format!("\u{1b}[2K{}", "r".repeat(100_000)),
            "message": format!("line\nforged{}", "m".repeat(1_000_000)),
        }))
        .unwrap();
    let err = client_for(&server)
        .wait_operation(&failed)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.len() < 4096, "{} bytes of error", text.len());
    assert!(!text.contains('\u{1b}') && !text.contains('\n'), "{text:?}");
}

/// A write checked just before the lease's deadline does not stay on its way past it: a
/// server that never answers holds it only until the deadline (not the 20 s request timeout),
/// after which the replica may no longer write and another may take over.
#[tokio::test]
async fn a_write_never_outlasts_the_lease_deadline() {
    use karpenter_exoscale::fence::Fence;
    let server = serve(Behaviour::Silent).await;
    let fence = Fence::closed();
    fence.extend_until(std::time::Instant::now() + Duration::from_millis(300));
    let client = client_for(&server).fenced(fence.clone());
    let answered = tokio::time::timeout(
        Duration::from_secs(10),
        client.delete_instance("0f6c1a52-5c1e-4d2a-9a43-1d1f4c0e7b11"),
    )
    .await
    .expect("given up at the lease deadline, long before the request timeout");
    let err = answered.unwrap_err();
    assert!(
        matches!(err, Error::Timeout { .. }),
        "a write given up on (its outcome unknown): {err:?}"
    );
    assert!(!fence.allows(), "the deadline has passed");
    assert_eq!(server.connections.load(Ordering::SeqCst), 1, "sent once");
}
