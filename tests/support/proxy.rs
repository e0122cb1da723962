//! A TCP proxy a test can cut, to partition one client from a server (e.g. a controller replica
//! from kube-apiserver) while everything else still reaches it.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub struct TcpProxy {
    addr: SocketAddr,
    cut: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl TcpProxy {
    /// Forwards connections on a free loopback port to `target`.
    pub async fn start(target: SocketAddr) -> TcpProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (cut, cut_rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut stop = cut_rx.clone();
            loop {
                let inbound = tokio::select! {
                    _ = stop.wait_for(|c| *c) => break,
                    accepted = listener.accept() => match accepted {
                        Ok((inbound, _)) => inbound,
                        Err(_) => continue,
                    },
                };
                let mut stop = cut_rx.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let mut inbound = inbound;
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        // Dropping both sockets ends the connection for both sides.
                        _ = stop.wait_for(|c| *c) => {}
                    }
                });
            }
            // The listener drops here: new connections are refused.
        });
        TcpProxy { addr, cut, task }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every forwarded connection and refuses new ones.
    pub fn cut(&self) {
        let _ = self.cut.send(true);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}
