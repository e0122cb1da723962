//! A real Kubernetes control plane on loopback for integration tests: etcd and
//! kube-apiserver, optionally kube-scheduler and kube-controller-manager, built by
//! `hack/control-plane.sh` (see docs/control-plane.md).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

use super::crds;
use super::pki;
use super::process::{Component, Reaper};

/// Directory holding the four binaries; printed by `hack/control-plane.sh`.
pub const BIN_DIR_ENV: &str = "KARPENTER_EXOSCALE_CONTROL_PLANE_BIN_DIR";
/// Accepted too: the name `hack/test.sh` exports.
pub const BIN_DIR_ENV_ALIAS: &str = "KARPENTER_TEST_BIN_DIR";
const BINARIES: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
];

/// Controllers of kube-controller-manager the tests rely on. Node lifecycle stays off: the
/// simulated kubelet posts no heartbeats, so it would mark every node unreachable.
pub const DEFAULT_CONTROLLERS: &[&str] = &[
    "garbage-collector-controller",
    "disruption-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "replicaset-controller",
    "deployment-controller",
];

const ETCD_READY_TIMEOUT: Duration = Duration::from_secs(60);
const APISERVER_READY_TIMEOUT: Duration = Duration::from_secs(120);
const COMPONENT_READY_TIMEOUT: Duration = Duration::from_secs(120);
const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// What to run besides etcd and kube-apiserver.
#[derive(Clone, Debug)]
pub struct Options {
    pub scheduler: bool,
    /// `None`: no kube-controller-manager; otherwise the controllers to enable.
    pub controllers: Option<Vec<String>>,
    /// Directory of CRD manifests to install (every `*.yaml`), or none.
    pub crd_dir: Option<PathBuf>,
    /// Where kube-apiserver writes its audit log (every request at `Metadata` level, one JSON
    /// line each), or none. The scale harness counts requests by user agent, verb and resource.
    pub audit_log: Option<PathBuf>,
}

impl Options {
    /// Everything: scheduler, controller-manager with [`DEFAULT_CONTROLLERS`], our CRDs.
    pub fn full() -> Self {
        Self {
            scheduler: true,
            controllers: Some(DEFAULT_CONTROLLERS.iter().map(|c| c.to_string()).collect()),
            crd_dir: Some(crds::project_crd_dir()),
            audit_log: None,
        }
    }

    /// What a user's cluster runs: scheduler, every controller kube-controller-manager enables
    /// by default (pod garbage collection, node lifecycle, DaemonSets, Jobs...), our CRDs.
    pub fn sandbox() -> Self {
        Self {
            scheduler: true,
            controllers: Some(vec!["*".to_string()]),
            crd_dir: Some(crds::project_crd_dir()),
            audit_log: None,
        }
    }

    /// Only etcd and kube-apiserver, with our CRDs.
    pub fn apiserver_only() -> Self {
        Self {
            scheduler: false,
            controllers: None,
            crd_dir: Some(crds::project_crd_dir()),
            audit_log: None,
        }
    }
}

/// A running control plane. Dropping it stops the processes and removes its directory;
/// if it is never dropped (a static, a crash), the reaper does the same at process exit.
pub struct ControlPlane {
    pub apiserver_url: String,
    pub kubeconfig_file: PathBuf,
    /// The CA that signed kube-apiserver's serving certificate (PEM).
    pub ca_cert_pem: String,
    pub bin_dir: PathBuf,
    kubeconfig: Kubeconfig,
    components: Mutex<Vec<Component>>,
    dir: Option<tempfile::TempDir>,
    reaper: Reaper,
}

/// Where the binaries are, or why they are not usable.
pub fn find_bin_dir() -> Result<PathBuf, String> {
    let from_env = std::env::var_os(BIN_DIR_ENV).or_else(|| std::env::var_os(BIN_DIR_ENV_ALIAS));
    let dir = match from_env {
        Some(dir) => PathBuf::from(dir),
        None => default_bin_dir()?,
    };
    for name in BINARIES {
        let binary = dir.join(name);
        if !binary.is_file() {
            return Err(format!(
                "{} is missing; build the control plane with `export {BIN_DIR_ENV}=$(hack/control-plane.sh)` \
                 (the first build takes ~15 minutes)",
                binary.display()
            ));
        }
    }
    Ok(dir)
}

/// `hack/control-plane.sh` keeps `<cache>/control-plane/current` pointing at its last build.
fn default_bin_dir() -> Result<PathBuf, String> {
    let cache_root = if let Some(root) = std::env::var_os("KARPENTER_EXOSCALE_CACHE") {
        PathBuf::from(root)
    } else if let Some(xdg) = std::env::var_os("XDG_CACHE_HOME") {
        PathBuf::from(xdg).join("karpenter-exoscale")
    } else if let Some(home) = std::env::var_os("HOME") {
        PathBuf::from(home).join(".cache/karpenter-exoscale")
    } else {
        return Err(format!("neither {BIN_DIR_ENV} nor HOME is set"));
    };
    Ok(cache_root.join("control-plane/current/bin"))
}

pub fn free_ports<const N: usize>() -> Result<[u16; N], String> {
    // Hold all listeners until every port is known so the N ports differ.
    let listeners: Vec<TcpListener> = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("finding a free loopback port: {e}"))?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener
            .local_addr()
            .map_err(|e| format!("reading a bound port: {e}"))?
            .port();
    }
    Ok(ports)
}

fn random_hex(bytes: usize) -> String {
    (0..bytes)
        .map(|_| format!("{:02x}", rand::random::<u8>()))
        .collect()
}

/// kube-apiserver flags for an audit log of every request's metadata at `log`.
fn audit_args(dir: &Path, log: Option<&Path>) -> Result<Vec<String>, String> {
    let Some(log) = log else {
        return Ok(Vec::new());
    };
    let policy = dir.join("audit-policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n",
    )
    .map_err(|e| format!("writing the audit policy: {e}"))?;
    Ok(vec![
        path_arg("audit-policy-file", &policy),
        path_arg("audit-log-path", log),
        "--audit-log-format=json".into(),
        // In MB; 0 is not "unlimited" but lumberjack's default of 100 MB, which rotated the log
        // mid-scenario at 1 000 nodes.
        "--audit-log-maxsize=100000".into(),
    ])
}

fn path_arg(flag: &str, path: &Path) -> String {
    format!("--{flag}={}", path.display())
}

/// Polls `probe` until it returns `Ok(true)`, failing fast if a component died.
async fn wait_until<F, Fut>(
    what: &str,
    timeout: Duration,
    components: &Mutex<Vec<Component>>,
    mut probe: F,
) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    loop {
        if probe().await {
            return Ok(());
        }
        for component in components.lock().expect("components lock").iter_mut() {
            component.check_running()?;
        }
        if started.elapsed() > timeout {
            let tails: Vec<String> = components
                .lock()
                .expect("components lock")
                .iter()
                .map(|c| format!("--- {} ---\n{}", c.name, c.log_tail(30)))
                .collect();
            return Err(format!(
                "{what} not ready after {timeout:?}\n{}",
                tails.join("\n")
            ));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

fn ensure_crypto_provider() {
    // Another test may have installed it already; either way ring is the provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl ControlPlane {
    /// Starts a control plane owned by the caller.
    pub async fn start(bin_dir: &Path, options: &Options) -> Result<Self, String> {
        ensure_crypto_provider();
        let mut reaper = Reaper::start()?;
        let dir = tempfile::Builder::new()
            .prefix("karpenter-exoscale-cp-")
            .tempdir()
            .map_err(|e| format!("creating the control plane's temp dir: {e}"))?;
        reaper.watch_dir(dir.path())?;
        let mut plane = Self {
            apiserver_url: String::new(),
            kubeconfig_file: dir.path().join("kubeconfig"),
            ca_cert_pem: String::new(),
            bin_dir: bin_dir.to_path_buf(),
            kubeconfig: Kubeconfig::default(),
            components: Mutex::new(Vec::new()),
            dir: Some(dir),
            reaper,
        };
        // On error `plane` is dropped here, which stops whatever did start.
        plane.boot(options).await?;
        Ok(plane)
    }

    fn dir(&self) -> &Path {
        self.dir.as_ref().expect("dir lives until drop").path()
    }

    fn spawn(&mut self, name: &str, args: Vec<String>) -> Result<(), String> {
        let binary = self.bin_dir.join(name);
        let log_dir = self.dir().to_path_buf();
        let component = Component::spawn(name, &binary, &args, &log_dir, &mut self.reaper)?;
        self.components
            .lock()
            .expect("components lock")
            .push(component);
        Ok(())
    }

    async fn boot(&mut self, options: &Options) -> Result<(), String> {
        let dir = self.dir().to_path_buf();
        let [
            etcd_port,
            etcd_peer_port,
            apiserver_port,
            scheduler_port,
            kcm_port,
        ] = free_ports::<5>()?;
        let pki = pki::generate(&dir)?;

        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let etcd_peer_url = format!("http://127.0.0.1:{etcd_peer_port}");
        self.spawn(
            "etcd",
            vec![
                "--name=node0".into(),
                path_arg("data-dir", &dir.join("etcd-data")),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={etcd_peer_url}"),
                format!("--initial-advertise-peer-urls={etcd_peer_url}"),
                format!("--initial-cluster=node0={etcd_peer_url}"),
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
            ],
        )?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| format!("building an HTTP client: {e}"))?;
        let etcd_health = format!("{etcd_url}/health");
        wait_until("etcd", ETCD_READY_TIMEOUT, &self.components, || {
            let request = http.get(&etcd_health).send();
            async move {
                match request.await {
                    Ok(response) if response.status().is_success() => response
                        .text()
                        .await
                        .is_ok_and(|body| body.contains("\"health\":\"true\"")),
                    _ => false,
                }
            }
        })
        .await?;

        let token = random_hex(24);
        let token_file = dir.join("tokens.csv");
        std::fs::write(
            &token_file,
            format!("{token},test-admin,test-admin,\"system:masters\"\n"),
        )
        .map_err(|e| format!("writing the token file: {e}"))?;
        self.spawn(
            "kube-apiserver",
            vec![
                format!("--etcd-servers={etcd_url}"),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                format!("--secure-port={apiserver_port}"),
                path_arg("cert-dir", &dir.join("apiserver-certs")),
                path_arg("tls-cert-file", &pki.serving_cert_file),
                path_arg("tls-private-key-file", &pki.serving_key_file),
                path_arg("client-ca-file", &pki.ca_cert_file),
                path_arg("token-auth-file", &token_file),
                "--authorization-mode=RBAC".into(),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                path_arg(
                    "service-account-signing-key-file",
                    &pki.service_account_key_file,
                ),
                path_arg(
                    "service-account-key-file",
                    &pki.service_account_public_key_file,
                ),
                "--service-cluster-ip-range=10.96.0.0/24".into(),
                // A loopback address cannot go into the `kubernetes` Endpoints.
                "--endpoint-reconciler-type=none".into(),
                "--allow-privileged=true".into(),
                // ServiceAccount: pods would wait for the default SA. TaintNodesByCondition:
                // only the (disabled) node-lifecycle controller would lift its not-ready taint.
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition".into(),
                "--enable-priority-and-fairness=false".into(),
                "--max-requests-inflight=0".into(),
                "--max-mutating-requests-inflight=0".into(),
                "--profiling=false".into(),
            ]
            .into_iter()
            .chain(audit_args(&dir, options.audit_log.as_deref())?)
            .collect(),
        )?;

        self.apiserver_url = format!("https://127.0.0.1:{apiserver_port}");
        self.ca_cert_pem = pki.ca_cert_pem.clone();
        let kubeconfig_text = kubeconfig_yaml(&self.apiserver_url, &pki.ca_cert_pem, &token);
        std::fs::write(&self.kubeconfig_file, &kubeconfig_text)
            .map_err(|e| format!("writing the kubeconfig: {e}"))?;
        self.kubeconfig = Kubeconfig::from_yaml(&kubeconfig_text)
            .map_err(|e| format!("reading back the generated kubeconfig: {e}"))?;
        let client = self.client().await;

        wait_until(
            "kube-apiserver /readyz",
            APISERVER_READY_TIMEOUT,
            &self.components,
            || {
                let client = client.clone();
                async move {
                    let request = http::Request::get("/readyz")
                        .body(Vec::new())
                        .expect("static request");
                    client.request_text(request).await.is_ok_and(|t| t == "ok")
                }
            },
        )
        .await?;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        wait_until(
            "namespace default",
            APISERVER_READY_TIMEOUT,
            &self.components,
            || {
                let namespaces = namespaces.clone();
                async move { namespaces.get("default").await.is_ok() }
            },
        )
        .await?;

        if let Some(crd_dir) = &options.crd_dir {
            crds::install_dir(&client, crd_dir).await?;
        }

        let kubeconfig_arg = path_arg("kubeconfig", &self.kubeconfig_file);
        if let Some(controllers) = &options.controllers {
            self.spawn(
                "kube-controller-manager",
                vec![
                    kubeconfig_arg.clone(),
                    "--leader-elect=false".into(),
                    "--bind-address=127.0.0.1".into(),
                    format!("--secure-port={kcm_port}"),
                    path_arg("root-ca-file", &pki.ca_cert_file),
                    path_arg(
                        "service-account-private-key-file",
                        &pki.service_account_key_file,
                    ),
                    "--use-service-account-credentials=false".into(),
                    // The default 20 requests/s would pace every burst of pods.
                    "--kube-api-qps=200".into(),
                    "--kube-api-burst=400".into(),
                    format!("--controllers={}", controllers.join(",")),
                ],
            )?;
        }
        if options.scheduler {
            self.spawn(
                "kube-scheduler",
                vec![
                    kubeconfig_arg,
                    "--leader-elect=false".into(),
                    "--bind-address=127.0.0.1".into(),
                    format!("--secure-port={scheduler_port}"),
                    "--kube-api-qps=200".into(),
                    "--kube-api-burst=400".into(),
                ],
            )?;
        }
        let mut probes = Vec::new();
        if options.controllers.is_some() {
            probes.push(("kube-controller-manager", kcm_port));
        }
        if options.scheduler {
            probes.push(("kube-scheduler", scheduler_port));
        }
        // Their serving certs are self-signed; only these readiness probes skip verification.
        let insecure = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| format!("building an HTTP client: {e}"))?;
        for (name, port) in probes {
            let url = format!("https://127.0.0.1:{port}/healthz");
            wait_until(name, COMPONENT_READY_TIMEOUT, &self.components, || {
                let request = insecure.get(&url).send();
                async move { request.await.is_ok_and(|r| r.status().is_success()) }
            })
            .await?;
        }
        Ok(())
    }

    /// A fresh client for the caller's runtime (a client must not outlive the runtime it
    /// was made in, and every `#[tokio::test]` has its own).
    pub async fn client(&self) -> kube::Client {
        kube::Client::try_from(self.config().await).expect("a client from the generated kubeconfig")
    }

    /// A client that returns 429/503/504 answers at once. kube's default client retries
    /// them (up to 15 times, backing off for minutes), which hides e.g. an eviction that a
    /// PodDisruptionBudget refuses.
    pub async fn client_without_retries(&self) -> kube::Client {
        let mut config = self.config().await;
        config.default_retry = false;
        kube::Client::try_from(config).expect("a client from the generated kubeconfig")
    }

    /// The admin client configuration (token auth, the plane's CA).
    pub async fn config(&self) -> kube::Config {
        kube::Config::from_custom_kubeconfig(self.kubeconfig.clone(), &KubeConfigOptions::default())
            .await
            .expect("the generated kubeconfig is valid")
    }

    /// Creates a namespace `<prefix>-<random>` for one test and returns its name.
    pub async fn namespace(&self, client: &kube::Client, prefix: &str) -> String {
        let name = format!("{prefix}-{}", random_hex(3));
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let namespace = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
        name
    }

    /// Waits until kube-controller-manager created the namespace's `default` service
    /// account: proof that its controllers are running.
    pub async fn wait_for_default_service_account(&self, client: &kube::Client, namespace: &str) {
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
        wait_until(
            "default service account",
            COMPONENT_READY_TIMEOUT,
            &self.components,
            || {
                let accounts = accounts.clone();
                async move { accounts.get("default").await.is_ok() }
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    }

    /// The plane's throwaway directory (PKI, data, logs).
    pub fn dir_path(&self) -> PathBuf {
        self.dir().to_path_buf()
    }

    /// Process ids of the running components, in start order.
    pub fn pids(&self) -> Vec<u32> {
        self.components
            .lock()
            .expect("components lock")
            .iter()
            .map(Component::pid)
            .collect()
    }

    /// Last lines of one component's log, for test failure messages.
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        self.components
            .lock()
            .expect("components lock")
            .iter()
            .find(|c| c.name == component)
            .map(|c| c.log_tail(lines))
            .unwrap_or_default()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let mut components = self.components.lock().unwrap_or_else(|e| e.into_inner());
        // Reverse start order: clients of etcd stop before etcd.
        for component in components.iter_mut().rev() {
            component.stop();
        }
        drop(components);
        self.reaper.dismiss();
        if let Some(dir) = self.dir.take() {
            let _ = dir.close();
        }
    }
}

fn kubeconfig_yaml(server: &str, ca_pem: &str, token: &str) -> String {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: test-admin
  user:
    token: {token}
contexts:
- name: test
  context:
    cluster: test
    user: test-admin
current-context: test
"
    )
}

static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();

/// The control-plane binaries, or `None` (with a message on stderr) when they are not built
/// and `CI` is not `true`; in CI a missing build fails the test.
pub fn bin_dir_or_skip(what: &str) -> Option<PathBuf> {
    match find_bin_dir() {
        Ok(dir) => Some(dir),
        Err(why) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("control plane binaries are required in CI: {why}")
        }
        Err(why) => {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "SKIPPING {what} (CI is not true): {why}");
            None
        }
    }
}

/// The control plane shared by all tests of this test binary (scheduler, controller-manager
/// and our CRDs included), started on first use. `None` (with a message on stderr) when the
/// binaries are not built and `CI` is not `true`; in CI a missing build fails the test.
pub fn shared() -> Option<&'static ControlPlane> {
    let bin_dir = match find_bin_dir() {
        Ok(dir) => dir,
        Err(why) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("control plane binaries are required in CI: {why}")
        }
        Err(why) => {
            // Straight to stderr: libtest hides `eprintln!` output of passing tests.
            static SKIP_NOTICE: std::sync::Once = std::sync::Once::new();
            SKIP_NOTICE.call_once(|| {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPING the control-plane tests of this binary (CI is not true): {why}"
                );
            });
            return None;
        }
    };
    let plane = SHARED.get_or_init(|| {
        // Started on a runtime of its own: tests' runtimes come and go, the plane stays.
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("building a runtime: {e}"))?;
            let started = Instant::now();
            let plane = runtime.block_on(ControlPlane::start(&bin_dir, &Options::full()))?;
            eprintln!(
                "control plane ready in {:.1} s (binaries from {})",
                started.elapsed().as_secs_f64(),
                bin_dir.display()
            );
            Ok(plane)
        })
        .join()
        .unwrap_or_else(|_| Err("control plane start-up panicked".to_string()))
    });
    match plane {
        Ok(plane) => Some(plane),
        Err(e) => panic!("starting the control plane failed: {e}"),
    }
}

/// What kubeadm or kube-controller-manager's root-CA publisher would provide: the cluster CA in
/// `kube-system/kube-root-ca.crt`, which node user data embeds. Used by the e2e tests and the
/// sandbox.
pub async fn publish_cluster_ca(client: &kube::Client, config: &kube::Config) {
    use base64::Engine;
    use kube::api::{Api, Patch, PatchParams};
    let der = config
        .root_cert
        .as_ref()
        .and_then(|c| c.first())
        .expect("the kubeconfig has a CA");
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = body
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    let pem = format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        lines.join("\n")
    );
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), "kube-system");
    let map = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": pem}});
    maps.patch(
        "kube-root-ca.crt",
        &PatchParams::apply("karpenter-exoscale-tests").force(),
        &Patch::Apply(&map),
    )
    .await
    .expect("publish the cluster CA");
}
