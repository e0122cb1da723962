//! The API server client, built as kube builds it but with a bound on idle connections.
//!
//! kube-client speaks HTTP/1.1 and keeps every connection a burst of concurrent requests opened
//! (a round's NodeClaim creates, a thousand launches' status writes) idle for 90 s, with no
//! limit on how many. Each holds its TLS session and read and write buffers: during a 1 000-node
//! launch the controller had 62–78 connections open to the API server, and their buffers were
//! ~9 MB of its heap at the launch's peak (BENCHMARKS, forty-first and forty-third sessions).
//! Here, connections beyond [`MAX_IDLE_CONNECTIONS`] close once their request is answered;
//! the ones in use (watches, requests in flight) are never capped. With eight, the count fell
//! to 20–30 between bursts, and the launch's RSS peaked ~6 MB lower than with the sized creates
//! alone (forty-third session).
//!
//! The rest is kube's own stack, from its public parts: TLS from the kubeconfig (rustls on
//! ring, the one crypto backend, installed here too), its connect, read and write timeouts, the
//! cluster URL, credentials that refresh, and the extra headers (our User-Agent). Two parts are
//! left out and refused: a proxy (kube's proxy features are not enabled here either) and kube's
//! client-side retry, which `run` turns off (reconcilers requeue on their own).

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use tower::{BoxError, ServiceBuilder};

/// Idle connections kept for the next requests. Enough for the requests a controller keeps in
/// flight between bursts, far fewer than a burst opens.
pub const MAX_IDLE_CONNECTIONS: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// kube would refuse it too: its proxy features are not enabled.
    #[error("the kubeconfig names a proxy; this build reaches the API server directly")]
    ProxyUnsupported,
    #[error("kube's client-side retry is not supported (reconcilers requeue)")]
    RetryUnsupported,
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// A client for `config`'s API server that keeps at most `max_idle` idle connections.
pub fn client(config: kube::Config, max_idle: usize) -> Result<kube::Client, ClientError> {
    if config.proxy_url.is_some() {
        return Err(ClientError::ProxyUnsupported);
    }
    if config.default_retry {
        return Err(ClientError::RetryUnsupported);
    }
    // ring is the only TLS backend; installing twice is harmless.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut http = HttpConnector::new();
    // The TLS connector on top decides the scheme (https, or http where the URL says so).
    http.enforce_http(false);
    let mut connector =
        hyper_timeout::TimeoutConnector::new(config.rustls_https_connector_with_connector(http)?);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let http_client = hyper_util::client::legacy::Builder::new(TokioExecutor::new())
        .pool_max_idle_per_host(max_idle)
        .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(http_client);
    Ok(kube::Client::new(service, config.default_namespace))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::time::Duration;

    use futures::future::join_all;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::{Barrier, mpsc};

    use super::*;

    /// A plain-HTTP API server stand-in: answers every request after `hold` (a barrier every
    /// request of a burst waits at, so they overlap), counts the connections it accepted and
    /// reports each one the client closes.
    struct Server {
        url: String,
        accepted: Arc<AtomicUsize>,
        closed: mpsc::UnboundedReceiver<()>,
    }

    async fn server(hold: Arc<Barrier>, burst: usize) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let answered = Arc::new(AtomicUsize::new(0));
        let (closed_tx, closed) = mpsc::unbounded_channel();
        let counter = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                counter.fetch_add(1, SeqCst);
                let (hold, answered, closed_tx) =
                    (hold.clone(), answered.clone(), closed_tx.clone());
                tokio::spawn(async move {
                    serve(stream, hold, answered, burst).await;
                    let _ = closed_tx.send(());
                });
            }
        });
        Server {
            url,
            accepted,
            closed,
        }
    }

    /// Answers requests on one connection until the client closes it.
    async fn serve(
        mut stream: TcpStream,
        hold: Arc<Barrier>,
        answered: Arc<AtomicUsize>,
        burst: usize,
    ) {
        let mut request = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => request.extend_from_slice(&buf[..n]),
            }
            // Requests without a body end at their blank line.
            while let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                request.drain(..end + 4);
                // The first burst's requests are answered together, once all have arrived.
                if answered.fetch_add(1, SeqCst) < burst {
                    hold.wait().await;
                }
                let body = br#"{"kind":"Status","apiVersion":"v1","status":"Success"}"#;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                );
                if stream.write_all(head.as_bytes()).await.is_err()
                    || stream.write_all(body).await.is_err()
                {
                    return;
                }
            }
        }
    }

    async fn get(client: &kube::Client) {
        let request = http::Request::get("/version").body(Vec::new()).unwrap();
        client.request_text(request).await.expect("an answer");
    }

    #[tokio::test]
    async fn a_burst_leaves_only_the_idle_bound_open_and_later_requests_reuse_them() {
        let burst = 12;
        let max_idle = 3;
        let hold = Arc::new(Barrier::new(burst));
        let mut server = server(hold, burst).await;
        let mut config = kube::Config::new(server.url.parse().unwrap());
        config.default_retry = false;
        let client = client(config, max_idle).unwrap();

        // Twelve requests in flight at once take twelve connections.
        join_all((0..burst).map(|_| get(&client))).await;
        assert_eq!(server.accepted.load(SeqCst), burst);

        // Once answered, all but three are closed by the client.
        for _ in 0..burst - max_idle {
            tokio::time::timeout(Duration::from_secs(30), server.closed.recv())
                .await
                .expect("the client closes the connections over its idle bound")
                .unwrap();
        }
        // The next requests, one at a time, go over a kept connection.
        for _ in 0..max_idle {
            get(&client).await;
        }
        assert_eq!(server.accepted.load(SeqCst), burst);
        assert!(
            server.closed.try_recv().is_err(),
            "a kept connection was closed"
        );
    }

    #[test]
    fn a_proxy_or_kubes_retry_is_refused_by_name() {
        let mut config = kube::Config::new("https://api.example:6443".parse().unwrap());
        config.default_retry = false;
        config.proxy_url = Some("http://proxy.example:3128".parse().unwrap());
        let refused = client(config.clone(), 1).map(|_| ()).unwrap_err();
        assert!(refused.to_string().contains("proxy"), "{refused}");
        config.proxy_url = None;
        config.default_retry = true;
        let refused = client(config, 1).map(|_| ()).unwrap_err();
        assert!(refused.to_string().contains("retry"), "{refused}");
    }
}
