//! The simulated account in one zone: catalogue, templates, SKS cluster, groups, networks,
//! instances and operations. Plain data and synchronous methods; HTTP lives in `http.rs`.

use std::collections::{BTreeMap, BTreeSet};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::Serialize;
use serde_json::{Value, json};

use crate::catalogue::Catalogue;
use crate::exoscale::models::*;

/// A reply: status and JSON body, plus work to finish once the operation completes.
#[derive(Debug)]
pub(crate) struct Reply {
    pub status: u16,
    pub body: Value,
    pub deferred: Option<Deferred>,
}

/// What happens when a pending operation completes.
#[derive(Debug, Clone)]
pub(crate) enum Deferred {
    /// Instance goes starting → running.
    Start { operation: String, instance: String },
    /// Instance goes destroying → gone.
    Destroy { operation: String, instance: String },
    /// Nothing but the operation turning `success`.
    Complete { operation: String },
    /// The operation ends in `failure`; a starting instance goes to `error`.
    Fail {
        operation: String,
        instance: Option<String>,
        reason: String,
        message: String,
    },
}

impl Deferred {
    /// The same work, but ending in failure (fault `FailOperation`).
    pub fn failing(self, reason: &str, message: &str) -> Deferred {
        let (operation, instance) = match self {
            Deferred::Start {
                operation,
                instance,
            } => (operation, Some(instance)),
            Deferred::Destroy { operation, .. }
            | Deferred::Complete { operation }
            | Deferred::Fail { operation, .. } => (operation, None),
        };
        Deferred::Fail {
            operation,
            instance,
            reason: reason.to_string(),
            message: message.to_string(),
        }
    }
}

fn ok<T: Serialize>(value: T) -> Reply {
    Reply {
        status: 200,
        body: serde_json::to_value(value).expect("sim models serialise"),
        deferred: None,
    }
}

pub(crate) fn error(status: u16, message: impl Into<String>) -> Reply {
    Reply {
        status,
        body: json!({ "message": message.into() }),
        deferred: None,
    }
}

/// A stable UUID derived from a name, for sim-owned objects.
pub(crate) fn stable_uuid(seed: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(seed.as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_random_bytes(bytes)
        .into_uuid()
        .to_string()
}

pub(crate) struct World {
    pub zone: String,
    pub endpoint: String,
    pub zones: Vec<String>,
    pub instance_types: Vec<InstanceType>,
    pub templates: Vec<Template>,
    /// (version, variant) → template id.
    pub sks_templates: BTreeMap<(String, SksTemplateVariant), String>,
    pub sks_versions: Vec<String>,
    pub clusters: Vec<SksCluster>,
    pub security_groups: Vec<SecurityGroup>,
    pub private_networks: Vec<PrivateNetwork>,
    pub anti_affinity_groups: Vec<AntiAffinityGroup>,
    /// In creation order.
    pub instances: Vec<Instance>,
    pub operations: BTreeMap<String, Operation>,
    pub instance_quota: Option<usize>,
    /// Instance types (`family.size`) whose hosts are full: creates get a 412 capacity error.
    pub exhausted_types: BTreeSet<String>,
    next_address: u32,
}

impl World {
    pub fn new(zone: &str, endpoint: &str, kubernetes_version: &str) -> World {
        let catalogue = Catalogue::embedded();
        let instance_types = catalogue
            .instance_types()
            .iter()
            .map(|t| InstanceType {
                id: t.id.clone(),
                family: t.family.clone(),
                size: t.size.clone(),
                cpus: t.cpus,
                gpus: t.gpus,
                memory: t.memory,
                authorized: t.authorized,
                zones: t.zones.clone(),
            })
            .collect();
        let zones: Vec<String> = catalogue.zones().to_vec();
        let mut sks_versions = vec![kubernetes_version.to_string()];
        for v in ["1.34.1", "1.33.5"] {
            if !sks_versions.iter().any(|x| x == v) {
                sks_versions.push(v.to_string());
            }
        }
        let mut world = World {
            zone: zone.to_string(),
            endpoint: endpoint.to_string(),
            zones,
            instance_types,
            templates: Vec::new(),
            sks_templates: BTreeMap::new(),
            sks_versions: sks_versions.clone(),
            clusters: Vec::new(),
            security_groups: Vec::new(),
            private_networks: Vec::new(),
            anti_affinity_groups: Vec::new(),
            instances: Vec::new(),
            operations: BTreeMap::new(),
            instance_quota: None,
            exhausted_types: BTreeSet::new(),
            next_address: 10,
        };
        world.templates.push(Template {
            id: "188e6dc9-7b29-4db4-a8af-fc6368660738".into(),
            name: "Linux Ubuntu 24.04 LTS 64-bit".into(),
            family: Some("ubuntu".into()),
            version: Some("24.04".into()),
            build: None,
            description: None,
            default_user: Some("ubuntu".into()),
            boot_mode: Some("uefi".into()),
            visibility: Some("public".into()),
            zones: world.zones.clone(),
            created_at: Some("2026-01-29T11:03:34Z".into()),
        });
        for version in &sks_versions {
            for variant in [SksTemplateVariant::Standard, SksTemplateVariant::Nvidia] {
                world.add_sks_template(version, variant);
            }
        }
        let default_sg = world.add_security_group("sks-default");
        world.add_security_group("karpenter-nodes");
        // The name the README's examples select.
        world.add_security_group("sks-nodes");
        world.add_private_network("karpenter-private");
        world.add_anti_affinity_group("karpenter-spread");
        let cluster_id = stable_uuid(&format!("sks-cluster/{zone}"));
        world.clusters.push(SksCluster {
            id: cluster_id.clone(),
            name: "sim-cluster".into(),
            description: Some("simulated SKS cluster".into()),
            version: kubernetes_version.to_string(),
            endpoint: Some(format!("https://{cluster_id}.sks-{zone}.exo.io")),
            state: Some("running".into()),
            level: Some("pro".into()),
            cni: Some("cilium".into()),
            addons: vec!["exoscale-cloud-controller".into(), "karpenter".into()],
            default_security_group_id: Some(default_sg),
            labels: Labels::new(),
            created_at: Some("2026-01-01T00:00:00Z".into()),
        });
        world
    }

    pub fn add_sks_template(&mut self, version: &str, variant: SksTemplateVariant) -> String {
        let id = stable_uuid(&format!("sks-template/{version}/{}", variant.as_str()));
        self.templates.push(Template {
            id: id.clone(),
            name: format!("SKS Node {version} ({})", variant.as_str()),
            family: Some("sks".into()),
            version: Some(version.to_string()),
            build: None,
            description: None,
            default_user: None,
            boot_mode: Some("uefi".into()),
            visibility: Some("public".into()),
            zones: self.zones.clone(),
            created_at: Some("2026-01-01T00:00:00Z".into()),
        });
        self.sks_templates
            .insert((version.to_string(), variant), id.clone());
        id
    }

    pub fn add_security_group(&mut self, name: &str) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        self.security_groups.push(SecurityGroup {
            id: id.clone(),
            name: name.to_string(),
            description: None,
            external_sources: Vec::new(),
        });
        id
    }

    pub fn add_private_network(&mut self, name: &str) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        self.private_networks.push(PrivateNetwork {
            id: id.clone(),
            name: name.to_string(),
            description: None,
            labels: Labels::new(),
            start_ip: Some("10.0.0.10".into()),
            end_ip: Some("10.0.0.250".into()),
            netmask: Some("255.255.255.0".into()),
            vni: Some(1000 + self.private_networks.len() as u32),
            leases: Vec::new(),
        });
        id
    }

    pub fn add_anti_affinity_group(&mut self, name: &str) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        self.anti_affinity_groups.push(AntiAffinityGroup {
            id: id.clone(),
            name: name.to_string(),
            description: None,
            instances: Vec::new(),
        });
        id
    }

    fn live_instances(&self) -> impl Iterator<Item = &Instance> {
        self.instances.iter().filter(|i| {
            !matches!(
                i.state,
                InstanceState::Destroying | InstanceState::Destroyed | InstanceState::Expunging
            )
        })
    }

    fn aag_with_members(&self, group: &AntiAffinityGroup) -> AntiAffinityGroup {
        let mut g = group.clone();
        g.instances = self
            .live_instances()
            .filter(|i| i.anti_affinity_groups.iter().any(|r| r.id == g.id))
            .map(|i| IdRef::new(&i.id))
            .collect();
        g
    }

    fn new_operation(&mut self, reference: &str, kind: &str) -> Operation {
        let op = Operation {
            id: uuid::Uuid::new_v4().to_string(),
            state: OperationState::Pending,
            reason: None,
            message: None,
            reference: Some(OperationReference {
                id: Some(reference.to_string()),
                link: Some(format!("/v2/{kind}/{reference}")),
                command: Some(format!("get-{kind}")),
            }),
        };
        self.operations.insert(op.id.clone(), op.clone());
        op
    }

    fn pending(
        &mut self,
        reference: &str,
        kind: &str,
        deferred: impl FnOnce(String) -> Deferred,
    ) -> Reply {
        let op = self.new_operation(reference, kind);
        let mut reply = ok(&op);
        reply.deferred = Some(deferred(op.id));
        reply
    }

    /// Applies a completed operation. Returns the instance that became running or was removed.
    pub fn complete(&mut self, deferred: &Deferred) -> Option<(Instance, bool)> {
        let (operation, outcome) = match deferred {
            Deferred::Start {
                operation,
                instance,
            } => {
                let found = self.instances.iter_mut().find(|i| &i.id == instance);
                let outcome = found.and_then(|i| {
                    (i.state == InstanceState::Starting).then(|| {
                        i.state = InstanceState::Running;
                        (i.clone(), true)
                    })
                });
                (operation, outcome)
            }
            Deferred::Destroy {
                operation,
                instance,
            } => {
                let index = self.instances.iter().position(|i| &i.id == instance);
                let outcome = index.map(|ix| (self.instances.remove(ix), false));
                for pn in &mut self.private_networks {
                    pn.leases.retain(|l| &l.instance_id != instance);
                }
                (operation, outcome)
            }
            Deferred::Complete { operation } => (operation, None),
            Deferred::Fail {
                operation,
                instance,
                reason,
                message,
            } => {
                if let Some(i) = self
                    .instances
                    .iter_mut()
                    .find(|i| Some(&i.id) == instance.as_ref())
                {
                    i.state = InstanceState::Error;
                }
                if let Some(op) = self.operations.get_mut(operation) {
                    op.state = OperationState::Failure;
                    op.reason = Some(reason.clone());
                    op.message = Some(message.clone());
                }
                return None;
            }
        };
        if let Some(op) = self.operations.get_mut(operation) {
            op.state = OperationState::Success;
        }
        outcome
    }

    // ---- read operations ----

    pub fn list_zones(&self) -> Reply {
        let zones: Vec<Zone> = self
            .zones
            .iter()
            .map(|z| Zone {
                name: z.clone(),
                api_endpoint: Some(if *z == self.zone {
                    self.endpoint.clone()
                } else {
                    format!("https://api-{z}.exoscale.com/v2")
                }),
                sos_endpoint: Some(format!("https://sos-{z}.exo.io")),
            })
            .collect();
        ok(ZoneList { zones })
    }

    pub fn list_instance_types(&self) -> Reply {
        ok(InstanceTypeList {
            instance_types: self.instance_types.clone(),
        })
    }

    pub fn get_instance_type(&self, id: &str) -> Reply {
        match self.instance_types.iter().find(|t| t.id == id) {
            Some(t) => ok(t),
            None => error(404, "Instance type not found"),
        }
    }

    pub fn get_instance(&self, id: &str) -> Reply {
        match self.instances.iter().find(|i| i.id == id) {
            Some(i) => ok(i),
            None => error(404, "Instance not found"),
        }
    }

    /// The list items lack anti-affinity groups, disk size and user data, as the real API's do.
    pub fn list_instances(&self) -> Reply {
        let instances = self
            .instances
            .iter()
            .map(|i| Instance {
                anti_affinity_groups: Vec::new(),
                disk_size: None,
                user_data: None,
                ..i.clone()
            })
            .collect();
        ok(InstanceList { instances })
    }

    pub fn list_templates(&self, visibility: Option<&str>, family: Option<&str>) -> Reply {
        let visibility = visibility.unwrap_or("public");
        let templates = self
            .templates
            .iter()
            .filter(|t| t.visibility.as_deref() == Some(visibility))
            .filter(|t| family.is_none_or(|f| t.family.as_deref() == Some(f)))
            .cloned()
            .collect();
        ok(TemplateList { templates })
    }

    pub fn get_template(&self, id: &str) -> Reply {
        match self.templates.iter().find(|t| t.id == id) {
            Some(t) => ok(t),
            None => error(404, "Template not found"),
        }
    }

    pub fn get_sks_template(&self, version: &str, variant: &str) -> Reply {
        let variant = match variant {
            "standard" => SksTemplateVariant::Standard,
            "nvidia" => SksTemplateVariant::Nvidia,
            other => return error(400, format!("invalid variant {other:?}")),
        };
        match self.sks_templates.get(&(version.to_string(), variant)) {
            Some(id) => ok(ActiveTemplate {
                active_template: id.clone(),
            }),
            None => error(
                404,
                format!(
                    "no active template for Kubernetes {version} ({})",
                    variant.as_str()
                ),
            ),
        }
    }

    pub fn list_sks_clusters(&self) -> Reply {
        ok(SksClusterList {
            sks_clusters: self.clusters.clone(),
        })
    }

    pub fn get_sks_cluster(&self, id: &str) -> Reply {
        match self.clusters.iter().find(|c| c.id == id) {
            Some(c) => ok(c),
            None => error(404, "SKS cluster not found"),
        }
    }

    pub fn list_sks_versions(&self) -> Reply {
        ok(SksVersionList {
            sks_cluster_versions: self.sks_versions.clone(),
        })
    }

    pub fn list_security_groups(&self) -> Reply {
        ok(SecurityGroupList {
            security_groups: self.security_groups.clone(),
        })
    }

    pub fn get_security_group(&self, id: &str) -> Reply {
        match self.security_groups.iter().find(|g| g.id == id) {
            Some(g) => ok(g),
            None => error(404, "Security group not found"),
        }
    }

    pub fn list_private_networks(&self) -> Reply {
        ok(PrivateNetworkList {
            private_networks: self.private_networks.clone(),
        })
    }

    pub fn get_private_network(&self, id: &str) -> Reply {
        match self.private_networks.iter().find(|g| g.id == id) {
            Some(g) => ok(g),
            None => error(404, "Private network not found"),
        }
    }

    pub fn list_anti_affinity_groups(&self) -> Reply {
        ok(AntiAffinityGroupList {
            anti_affinity_groups: self
                .anti_affinity_groups
                .iter()
                .map(|g| self.aag_with_members(g))
                .collect(),
        })
    }

    pub fn get_anti_affinity_group(&self, id: &str) -> Reply {
        match self.anti_affinity_groups.iter().find(|g| g.id == id) {
            Some(g) => ok(self.aag_with_members(g)),
            None => error(404, "Anti-affinity group not found"),
        }
    }

    pub fn get_operation(&self, id: &str) -> Reply {
        match self.operations.get(id) {
            Some(op) => ok(op),
            None => error(404, "Operation not found"),
        }
    }

    // ---- mutations ----

    pub fn create_instance(&mut self, body: &[u8]) -> Reply {
        let req: CreateInstanceRequest = match serde_json::from_slice(body) {
            Ok(r) => r,
            Err(e) => return error(400, format!("Invalid request body: {e}")),
        };
        if let Err((status, message)) = self.validate_create(&req) {
            return error(status, message);
        }
        let id = uuid::Uuid::new_v4().to_string();
        self.next_address += 1;
        let n = self.next_address;
        let assignment = req
            .public_ip_assignment
            .clone()
            .unwrap_or_else(|| "inet4".into());
        let instance = Instance {
            id: id.clone(),
            name: req
                .name
                .clone()
                .unwrap_or_else(|| format!("vm-{}", &id[..8])),
            state: InstanceState::Starting,
            created_at: Some(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
            instance_type: req.instance_type.clone(),
            template: req.template.clone(),
            disk_size: Some(req.disk_size),
            labels: req.labels.clone(),
            user_data: req.user_data.clone(),
            security_groups: req.security_groups.clone(),
            anti_affinity_groups: req.anti_affinity_groups.clone(),
            private_networks: Vec::new(),
            public_ip: (assignment != "none")
                .then(|| format!("194.182.{}.{}", (n >> 8) & 0xff, n & 0xff)),
            public_ip_assignment: Some(assignment),
            ipv6_address: None,
            mac_address: Some(format!(
                "06:00:00:00:{:02x}:{:02x}",
                (n >> 8) & 0xff,
                n & 0xff
            )),
            manager: None,
        };
        self.instances.push(instance);
        self.pending(&id, "instance", |operation| Deferred::Start {
            operation,
            instance: id.clone(),
        })
    }

    fn validate_create(&self, req: &CreateInstanceRequest) -> Result<(), (u16, String)> {
        if !(10..=51200).contains(&req.disk_size) {
            return Err((400, "disk-size must be between 10 and 51200".into()));
        }
        if let Some(name) = &req.name
            && (name.is_empty() || name.len() > 255)
        {
            return Err((400, "name must be 1 to 255 characters".into()));
        }
        if let Some(ud) = &req.user_data {
            if ud.is_empty() || ud.len() >= 32768 {
                return Err((400, "user-data must be 1 to 32767 base64 characters".into()));
            }
            if BASE64.decode(ud.as_bytes()).is_err() {
                return Err((400, "user-data must be base64-encoded".into()));
            }
        }
        let Some(itype) = self
            .instance_types
            .iter()
            .find(|t| t.id == req.instance_type.id)
        else {
            return Err((
                400,
                format!("Invalid instance type {}", req.instance_type.id),
            ));
        };
        if !itype.authorized {
            return Err((
                400,
                format!(
                    "Instance type {} is not authorized for this organization",
                    itype.name()
                ),
            ));
        }
        if self.exhausted_types.contains(&itype.name()) {
            return Err((
                412,
                format!(
                    "Insufficient capacity for instance type {} in zone {}",
                    itype.name(),
                    self.zone
                ),
            ));
        }
        if !itype.zones.contains(&self.zone) {
            return Err((
                400,
                format!(
                    "Instance type {} is not available in zone {}",
                    itype.name(),
                    self.zone
                ),
            ));
        }
        if !self.templates.iter().any(|t| t.id == req.template.id) {
            return Err((400, format!("Invalid template {}", req.template.id)));
        }
        for sg in &req.security_groups {
            if !self.security_groups.iter().any(|g| g.id == sg.id) {
                return Err((400, format!("Invalid security group {}", sg.id)));
            }
        }
        for aag in &req.anti_affinity_groups {
            let Some(group) = self.anti_affinity_groups.iter().find(|g| g.id == aag.id) else {
                return Err((400, format!("Invalid anti-affinity group {}", aag.id)));
            };
            if self.aag_with_members(group).is_full() {
                return Err((
                    400,
                    format!(
                        "Anti-affinity group {} is full ({MAX_ANTI_AFFINITY_GROUP_MEMBERS} instances max)",
                        group.name
                    ),
                ));
            }
        }
        if let Some(limit) = self.instance_quota
            && self.live_instances().count() >= limit
        {
            return Err((403, quota_message(limit)));
        }
        Ok(())
    }

    pub fn update_instance(&mut self, id: &str, body: &[u8]) -> Reply {
        let req: UpdateInstanceRequest = match serde_json::from_slice(body) {
            Ok(r) => r,
            Err(e) => return error(400, format!("Invalid request body: {e}")),
        };
        let Some(instance) = self.instances.iter_mut().find(|i| i.id == id) else {
            return error(404, "Instance not found");
        };
        if let Some(labels) = req.labels {
            instance.labels = labels;
        }
        if let Some(name) = req.name {
            instance.name = name;
        }
        if let Some(ud) = req.user_data {
            instance.user_data = Some(ud);
        }
        let id = id.to_string();
        self.pending(&id, "instance", |operation| Deferred::Complete {
            operation,
        })
    }

    pub fn delete_instance(&mut self, id: &str) -> Reply {
        let Some(instance) = self.instances.iter_mut().find(|i| i.id == id) else {
            return error(404, "Instance not found");
        };
        if instance.state == InstanceState::Destroying {
            return error(409, "Instance is already being destroyed");
        }
        instance.state = InstanceState::Destroying;
        let id = id.to_string();
        self.pending(&id, "instance", |operation| Deferred::Destroy {
            operation,
            instance: id.clone(),
        })
    }

    pub fn attach_security_group(&mut self, sg_id: &str, body: &[u8]) -> Reply {
        let req: AttachInstanceRequest = match serde_json::from_slice(body) {
            Ok(r) => r,
            Err(e) => return error(400, format!("Invalid request body: {e}")),
        };
        if !self.security_groups.iter().any(|g| g.id == sg_id) {
            return error(404, "Security group not found");
        }
        let Some(instance) = self.instances.iter_mut().find(|i| i.id == req.instance.id) else {
            return error(404, "Instance not found");
        };
        if instance.security_groups.iter().any(|g| g.id == sg_id) {
            return error(409, "Instance is already in this security group");
        }
        instance.security_groups.push(IdRef::new(sg_id));
        let sg_id = sg_id.to_string();
        self.pending(&sg_id, "security-group", |operation| Deferred::Complete {
            operation,
        })
    }

    pub fn attach_private_network(&mut self, pn_id: &str, body: &[u8]) -> Reply {
        let req: AttachInstanceRequest = match serde_json::from_slice(body) {
            Ok(r) => r,
            Err(e) => return error(400, format!("Invalid request body: {e}")),
        };
        let Some(pn_index) = self.private_networks.iter().position(|p| p.id == pn_id) else {
            return error(404, "Private network not found");
        };
        let Some(instance) = self.instances.iter_mut().find(|i| i.id == req.instance.id) else {
            return error(404, "Instance not found");
        };
        if instance.private_networks.iter().any(|p| p.id == pn_id) {
            return error(409, "Instance is already attached to this private network");
        }
        let pn = &mut self.private_networks[pn_index];
        let ip = req
            .ip
            .clone()
            .unwrap_or_else(|| format!("10.0.0.{}", 10 + pn.leases.len()));
        pn.leases.push(PrivateNetworkLease {
            ip: Some(ip),
            instance_id: instance.id.clone(),
        });
        let n = instance.private_networks.len() + 1;
        instance.private_networks.push(InstancePrivateNetwork {
            id: pn_id.to_string(),
            mac_address: Some(format!("0a:00:00:00:{n:02x}:{:02x}", pn.leases.len())),
        });
        let pn_id = pn_id.to_string();
        self.pending(&pn_id, "private-network", |operation| Deferred::Complete {
            operation,
        })
    }
}

fn quota_message(limit: usize) -> String {
    format!("Quota exceeded for resource instance (limit {limit})")
}

pub(crate) fn quota_exceeded(limit: usize) -> Reply {
    error(403, quota_message(limit))
}

/// The readable form of stored user data (the provider's one decoder).
pub fn decode_user_data(encoded: &str) -> Option<String> {
    crate::providers::userdata::decode(encoded)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn world() -> World {
        World::new("ch-gva-2", "http://sim/v2", "1.34.1")
    }

    fn create_body(world: &World, extra: Value) -> Vec<u8> {
        let mut body = json!({
            "name": "n1",
            "instance-type": {"id": world.instance_types.iter().find(|t| t.name() == "standard.small").unwrap().id},
            "template": {"id": world.sks_templates[&("1.34.1".to_string(), SksTemplateVariant::Standard)]},
            "disk-size": 20,
        });
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::to_vec(&body).unwrap()
    }

    #[test]
    fn create_then_complete_makes_the_instance_run() {
        let mut w = world();
        let body = create_body(&w, json!({}));
        let reply = w.create_instance(&body);
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(w.instances[0].state, InstanceState::Starting);
        let deferred = reply.deferred.unwrap();
        let (instance, running) = w.complete(&deferred).unwrap();
        assert!(running);
        assert_eq!(instance.state, InstanceState::Running);
        let Deferred::Start { operation, .. } = deferred else {
            panic!()
        };
        assert_eq!(w.operations[&operation].state, OperationState::Success);
    }

    #[test]
    fn create_validation() {
        let mut w = world();
        let gpu = w
            .instance_types
            .iter()
            .find(|t| t.name() == "gpu3.small")
            .unwrap()
            .id
            .clone();
        let body = create_body(&w, json!({"instance-type": {"id": gpu}}));
        let reply = w.create_instance(&body);
        assert_eq!(reply.status, 400);
        assert!(
            reply.body["message"]
                .as_str()
                .unwrap()
                .contains("not authorized")
        );
        let body = create_body(&w, json!({"disk-size": 5}));
        assert_eq!(w.create_instance(&body).status, 400);
        let body = create_body(&w, json!({"user-data": "%%%"}));
        assert_eq!(w.create_instance(&body).status, 400);
        assert_eq!(w.create_instance(b"{}").status, 400);
        w.instance_quota = Some(0);
        let body = create_body(&w, json!({}));
        assert_eq!(w.create_instance(&body).status, 403);
        assert!(w.instances.is_empty());
    }

    #[test]
    fn an_exhausted_instance_type_gets_a_capacity_error_and_others_still_launch() {
        let mut w = world();
        w.exhausted_types.insert("standard.small".into());
        let body = create_body(&w, json!({}));
        let reply = w.create_instance(&body);
        assert_eq!(reply.status, 412);
        let message = reply.body["message"].as_str().unwrap();
        assert!(message.contains("Insufficient capacity"), "{message}");
        assert!(message.contains("standard.small"), "{message}");
        assert!(w.instances.is_empty());
        let medium = w
            .instance_types
            .iter()
            .find(|t| t.name() == "standard.medium")
            .unwrap()
            .id
            .clone();
        let body = create_body(&w, json!({"instance-type": {"id": medium}}));
        assert_eq!(w.create_instance(&body).status, 200);
    }

    #[test]
    fn anti_affinity_groups_hold_at_most_eight() {
        let mut w = world();
        let aag = w.anti_affinity_groups[0].id.clone();
        let body = create_body(&w, json!({"anti-affinity-groups": [{"id": aag}]}));
        for _ in 0..8 {
            assert_eq!(w.create_instance(&body).status, 200);
        }
        let reply = w.create_instance(&body);
        assert_eq!(reply.status, 400);
        assert!(reply.body["message"].as_str().unwrap().contains("is full"));
        assert_eq!(
            w.get_anti_affinity_group(&aag).body["instances"]
                .as_array()
                .unwrap()
                .len(),
            8
        );
    }

    #[test]
    fn user_data_is_decoded_plain_or_gzipped() {
        use std::io::Write;
        assert_eq!(decode_user_data(&BASE64.encode("a = 1")).unwrap(), "a = 1");
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(b"[settings]").unwrap();
        let gz = gz.finish().unwrap();
        assert_eq!(decode_user_data(&BASE64.encode(gz)).unwrap(), "[settings]");
    }
}
