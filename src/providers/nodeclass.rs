//! Resolution of an ExoscaleNodeClass's security groups, anti-affinity groups and private
//! networks to IDs (deprecated ID lists first, then selector terms, duplicates dropped). The
//! NodeClass controller writes the results to the status; `create` uses the status.
//!
//! One cached list call per kind serves ID and name lookups; a miss refreshes the list once, so
//! a just-created group is found without waiting for the TTL.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use thiserror::Error;

use crate::apis::ExoscaleNodeClassSpec;
use crate::apis::nodeclass::SelectorTerm;
use crate::clock::Clock;
use crate::exoscale;
use crate::exoscale::models::{AntiAffinityGroup, PrivateNetwork, SecurityGroup};

/// How long a list of groups serves name lookups (the Go provider's value).
pub const NAME_CACHE_TTL: Duration = Duration::from_secs(60);

#[derive(Debug, Error, Clone, PartialEq)]
pub enum ResolutionError {
    #[error("failed to get {kind} {id}: {source}")]
    ById {
        kind: &'static str,
        id: String,
        source: Box<exoscale::Error>,
    },
    #[error("{kind} with name {name} not found")]
    NameNotFound { kind: &'static str, name: String },
    #[error("{kind} selector term must set exactly one of id or name")]
    BadTerm { kind: &'static str },
    #[error("failed to get {kind} by name: {source}")]
    List {
        kind: &'static str,
        source: Box<exoscale::Error>,
    },
}

/// An Exoscale object with an id and a name.
pub trait Named: Clone + Send + Sync + 'static {
    const KIND: &'static str;
    fn id(&self) -> &str;
    fn name(&self) -> &str;
}

impl Named for SecurityGroup {
    const KIND: &'static str = "security group";
    fn id(&self) -> &str {
        &self.id
    }
    fn name(&self) -> &str {
        &self.name
    }
}

impl Named for AntiAffinityGroup {
    const KIND: &'static str = "anti-affinity group";
    fn id(&self) -> &str {
        &self.id
    }
    fn name(&self) -> &str {
        &self.name
    }
}

impl Named for PrivateNetwork {
    const KIND: &'static str = "private network";
    fn id(&self) -> &str {
        &self.id
    }
    fn name(&self) -> &str {
        &self.name
    }
}

/// What to look up: an id or a name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reference {
    Id(String),
    Name(String),
}

/// The deprecated ID list followed by the selector terms, in order.
pub fn references(
    kind: &'static str,
    deprecated_ids: &[String],
    terms: &[SelectorTerm],
) -> Result<Vec<Reference>, ResolutionError> {
    let mut out: Vec<Reference> = deprecated_ids.iter().cloned().map(Reference::Id).collect();
    for t in terms {
        out.push(match (&t.id, &t.name) {
            (Some(id), None) => Reference::Id(id.clone()),
            (None, Some(name)) => Reference::Name(name.clone()),
            _ => return Err(ResolutionError::BadTerm { kind }),
        });
    }
    Ok(out)
}

/// Resolves references against a list, returning IDs in order without duplicates; references
/// the list does not contain are returned separately.
pub fn resolve_in_list<T: Named>(refs: &[Reference], list: &[T]) -> (Vec<String>, Vec<Reference>) {
    let mut ids: Vec<String> = Vec::new();
    let mut missing = Vec::new();
    for r in refs {
        let found = list.iter().find(|o| match r {
            Reference::Id(id) => o.id() == id,
            Reference::Name(name) => o.name() == name,
        });
        match found {
            Some(o) => {
                if !ids.iter().any(|i| i == o.id()) {
                    ids.push(o.id().to_string());
                }
            }
            None => missing.push(r.clone()),
        }
    }
    (ids, missing)
}

struct ListCache<T> {
    items: Vec<T>,
    fetched_at: i64,
}

/// Resolves NodeClass references with per-kind list caches.
pub struct NodeClassResolver {
    client: exoscale::Client,
    clock: Arc<dyn Clock>,
    ttl: Duration,
    security_groups: Mutex<Option<ListCache<SecurityGroup>>>,
    anti_affinity_groups: Mutex<Option<ListCache<AntiAffinityGroup>>>,
    private_networks: Mutex<Option<ListCache<PrivateNetwork>>>,
}

impl NodeClassResolver {
    pub fn new(client: exoscale::Client, clock: Arc<dyn Clock>, ttl: Duration) -> Self {
        NodeClassResolver {
            client,
            clock,
            ttl,
            security_groups: Mutex::new(None),
            anti_affinity_groups: Mutex::new(None),
            private_networks: Mutex::new(None),
        }
    }

    async fn resolve<T, L, LF, G, GF>(
        &self,
        cache: &Mutex<Option<ListCache<T>>>,
        refs: Vec<Reference>,
        list: L,
        get: G,
    ) -> Result<Vec<String>, ResolutionError>
    where
        T: Named,
        L: Fn() -> LF,
        LF: Future<Output = Result<Vec<T>, exoscale::Error>>,
        G: Fn(String) -> GF,
        GF: Future<Output = Result<T, exoscale::Error>>,
    {
        if refs.is_empty() {
            return Ok(Vec::new());
        }
        let now = self.clock.now_unix();
        let cached: Option<Vec<T>> = cache
            .lock()
            .expect("lock")
            .as_ref()
            .filter(|c| now.saturating_sub(c.fetched_at) < self.ttl.as_secs() as i64)
            .map(|c| c.items.clone());
        let (items, fresh) = match cached {
            Some(items) => (items, false),
            None => (self.refresh(cache, &list).await?, true),
        };
        let (_, missing) = resolve_in_list(&refs, &items);
        let items = if !missing.is_empty() && !fresh {
            self.refresh(cache, &list).await?
        } else {
            items
        };
        let (_, missing) = resolve_in_list(&refs, &items);
        // IDs the list lacks are fetched one by one (the list may be paginated or stale).
        let mut extra = Vec::new();
        for r in missing {
            match r {
                Reference::Id(id) => {
                    let o = get(id.clone())
                        .await
                        .map_err(|source| ResolutionError::ById {
                            kind: T::KIND,
                            id: id.clone(),
                            source: Box::new(source),
                        })?;
                    extra.push(o);
                }
                Reference::Name(name) => {
                    return Err(ResolutionError::NameNotFound {
                        kind: T::KIND,
                        name,
                    });
                }
            }
        }
        let all: Vec<T> = items.into_iter().chain(extra).collect();
        Ok(resolve_in_list(&refs, &all).0)
    }

    async fn refresh<T, L, LF>(
        &self,
        cache: &Mutex<Option<ListCache<T>>>,
        list: &L,
    ) -> Result<Vec<T>, ResolutionError>
    where
        T: Named,
        L: Fn() -> LF,
        LF: Future<Output = Result<Vec<T>, exoscale::Error>>,
    {
        // A failed fetch leaves the previous cache untouched.
        let items = list().await.map_err(|source| ResolutionError::List {
            kind: T::KIND,
            source: Box::new(source),
        })?;
        *cache.lock().expect("lock") = Some(ListCache {
            items: items.clone(),
            fetched_at: self.clock.now_unix(),
        });
        Ok(items)
    }

    pub async fn resolve_security_groups(
        &self,
        spec: &ExoscaleNodeClassSpec,
    ) -> Result<Vec<String>, ResolutionError> {
        let refs = references(
            SecurityGroup::KIND,
            &spec.security_groups,
            &spec.security_group_selector_terms,
        )?;
        self.resolve(
            &self.security_groups,
            refs,
            || self.client.list_security_groups(),
            |id| async move { self.client.get_security_group(&id).await },
        )
        .await
    }

    pub async fn resolve_anti_affinity_groups(
        &self,
        spec: &ExoscaleNodeClassSpec,
    ) -> Result<Vec<String>, ResolutionError> {
        let refs = references(
            AntiAffinityGroup::KIND,
            &spec.anti_affinity_groups,
            &spec.anti_affinity_group_selector_terms,
        )?;
        self.resolve(
            &self.anti_affinity_groups,
            refs,
            || self.client.list_anti_affinity_groups(),
            |id| async move { self.client.get_anti_affinity_group(&id).await },
        )
        .await
    }

    pub async fn resolve_private_networks(
        &self,
        spec: &ExoscaleNodeClassSpec,
    ) -> Result<Vec<String>, ResolutionError> {
        let refs = references(
            PrivateNetwork::KIND,
            &spec.private_networks,
            &spec.private_network_selector_terms,
        )?;
        self.resolve(
            &self.private_networks,
            refs,
            || self.client.list_private_networks(),
            |id| async move { self.client.get_private_network(&id).await },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sg(id: &str, name: &str) -> SecurityGroup {
        SecurityGroup {
            id: id.into(),
            name: name.into(),
            description: None,
            external_sources: vec![],
        }
    }

    fn term(id: Option<&str>, name: Option<&str>) -> SelectorTerm {
        SelectorTerm {
            id: id.map(Into::into),
            name: name.map(Into::into),
        }
    }

    #[test]
    fn references_keep_the_go_order_deprecated_ids_first() {
        let refs = references(
            "security group",
            &["a".into()],
            &[term(Some("b"), None), term(None, Some("web"))],
        )
        .unwrap();
        assert_eq!(
            refs,
            vec![
                Reference::Id("a".into()),
                Reference::Id("b".into()),
                Reference::Name("web".into())
            ]
        );
        let e = references("security group", &[], &[term(Some("b"), Some("x"))]).unwrap_err();
        assert!(e.to_string().contains("exactly one"), "{e}");
    }

    #[test]
    fn list_resolution_dedupes_and_reports_missing() {
        let list = [sg("1", "web"), sg("2", "db")];
        let refs = [
            Reference::Id("2".into()),
            Reference::Name("web".into()),
            Reference::Id("1".into()),
            Reference::Name("nope".into()),
            Reference::Id("9".into()),
        ];
        let (ids, missing) = resolve_in_list(&refs, &list);
        assert_eq!(ids, vec!["2", "1"]);
        assert_eq!(
            missing,
            vec![Reference::Name("nope".into()), Reference::Id("9".into())]
        );
    }
}
