//! A TCP proxy on a free loopback port whose connections the test can cut
//! at once, as a load balancer or a dying client host would.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

pub struct CuttableProxy {
    pub addr: SocketAddr,
    accept: tokio::task::JoinHandle<()>,
    connections: std::sync::Arc<std::sync::Mutex<JoinSet<()>>>,
}

impl CuttableProxy {
    /// Forwards every connection to `target`.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = std::sync::Arc::new(std::sync::Mutex::new(JoinSet::new()));
        let all = connections.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                all.lock().unwrap().spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        CuttableProxy {
            addr,
            accept,
            connections,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Closes every connection through the proxy, both ways, at once.
    pub fn cut(&self) {
        self.connections.lock().unwrap().abort_all();
    }
}

impl Drop for CuttableProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}
