//! The standalone sim (`karpenter-exoscale sim`) prints env lines that `doctor` and the
//! client can use as they are.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use karpenter_exoscale::doctor::{self, DoctorConfig};
use karpenter_exoscale::exoscale::{Client, ClientConfig, Credentials, Error};
use karpenter_exoscale::sim::{SimConfig, serve_until};

/// A `Write` whose contents the test can read while the server runs.
#[derive(Clone, Default)]
struct SharedBuf(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for SharedBuf {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn env_lines(buf: &SharedBuf) -> HashMap<String, String> {
    for _ in 0..3000 {
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        if text.contains("EXOSCALE_SKS_CLUSTER_ID=") {
            return text
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the sim never printed its environment");
}

#[tokio::test]
async fn printed_environment_drives_doctor_and_the_client() {
    let buf = SharedBuf::default();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let config = SimConfig {
        zone: "de-fra-1".into(),
        api_key: Some("EXOgiven".into()),
        api_secret: Some("given-secret".into()),
        ..SimConfig::default()
    };
    let mut out = buf.clone();
    let server = tokio::spawn(async move {
        serve_until(
            config,
            async {
                let _ = stop_rx.await;
            },
            &mut out,
        )
        .await
    });
    let env = env_lines(&buf).await;
    assert_eq!(env["EXOSCALE_API_KEY"], "EXOgiven");
    assert_eq!(env["EXOSCALE_API_SECRET"], "given-secret");
    assert_eq!(env["EXOSCALE_ZONE"], "de-fra-1");
    assert!(env["EXOSCALE_API_ENDPOINT"].starts_with("http://127.0.0.1:"));

    let cfg = DoctorConfig::from_lookup(|name| env.get(name).cloned()).unwrap();
    let mut report = Vec::new();
    assert!(
        doctor::run(&cfg, &mut report).await,
        "{}",
        String::from_utf8_lossy(&report)
    );

    let client_config = ClientConfig::for_zone(
        "de-fra-1",
        Some(&env["EXOSCALE_API_ENDPOINT"]),
        None,
        Credentials::new("EXOgiven", "given-secret"),
    )
    .unwrap();
    let client = Client::connect(client_config.clone(), "de-fra-1")
        .await
        .unwrap();
    let cluster = client
        .get_sks_cluster(&env["EXOSCALE_SKS_CLUSTER_ID"])
        .await
        .unwrap();
    assert!(cluster.endpoint.unwrap().contains("sks-de-fra-1"));
    assert!(matches!(
        Client::connect(client_config, "ch-zrh-1").await,
        Err(Error::UnknownZone { .. })
    ));

    stop_tx.send(()).unwrap();
    drop(client);
    tokio::time::timeout(Duration::from_secs(30), server)
        .await
        .expect("the sim stops")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn an_occupied_port_is_a_named_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let config = SimConfig {
        listen: taken.local_addr().unwrap(),
        ..SimConfig::default()
    };
    let err = serve_until(config, async {}, &mut Vec::new())
        .await
        .unwrap_err();
    assert!(
        err.to_string().starts_with("cannot listen on 127.0.0.1:"),
        "{err}"
    );
}

/// `sim --listen` on a non-loopback address is refused unless `--allow-remote` says so.
#[test]
fn the_sim_refuses_a_non_loopback_listen_address() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_karpenter-exoscale"))
        .args(["sim", "--listen", "0.0.0.0:0"])
        .output()
        .expect("run the binary");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--allow-remote"), "{stderr}");
    assert!(stderr.contains("0.0.0.0"), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "credentials printed: {:?}",
        out.stdout
    );
    assert!(karpenter_exoscale::sim::check_listen("0.0.0.0:0".parse().unwrap(), true).is_ok());
    assert!(karpenter_exoscale::sim::check_listen("[::1]:0".parse().unwrap(), false).is_ok());
}
