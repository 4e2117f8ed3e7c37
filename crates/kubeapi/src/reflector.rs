//! A reflector: list, then watch from the list's resource version, keeping a map of the
//! objects by (namespace, name) and turning what it sees into add / update / delete events.
//!
//! Recovery follows client-go's reflector: a watch that ends is reopened from the last
//! resource version seen (bookmarks included); `410 Gone` (as a status or an `ERROR` event)
//! or any other `ERROR` event means a relist, whose result is diffed against the map so the
//! consumer sees exactly the changes it missed, followed by [`ReflectorEvent::Synced`].
//! Failures are returned from [`Reflector::next`] for the caller to log; the next call
//! retries after an exponential backoff.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use serde_json::Value;

use crate::client::{Client, Error};
use crate::watch::{EventType, WatchStream};

/// (namespace, name); the namespace is empty for cluster-scoped objects.
pub type ObjectKey = (String, String);

/// What changed.
#[derive(Debug, Clone, PartialEq)]
pub enum ReflectorEvent {
    Added(Value),
    Updated(Value),
    /// The object's last state.
    Deleted(Value),
    /// The map now matches a complete list (after the first list and after every relist).
    Synced,
}

/// The key of an object from its metadata, `None` without a name.
pub fn object_key(object: &Value) -> Option<ObjectKey> {
    let meta = object.get("metadata")?;
    let name = meta.get("name")?.as_str().filter(|n| !n.is_empty())?;
    let namespace = meta.get("namespace").and_then(Value::as_str).unwrap_or("");
    Some((namespace.to_string(), name.to_string()))
}

fn resource_version(object: &Value) -> Option<&str> {
    object
        .get("metadata")?
        .get("resourceVersion")?
        .as_str()
        .filter(|rv| !rv.is_empty())
}

/// List + watch of one resource path.
#[derive(Debug)]
pub struct Reflector {
    client: Client,
    path: String,
    field_selector: Option<String>,
    store: BTreeMap<ObjectKey, Value>,
    /// `None`: a (re)list is needed.
    resource_version: Option<String>,
    watch: Option<WatchStream>,
    /// Whether the open watch delivered anything (a watch that ends empty is reopened only
    /// after a pause, so a server that closes at once is not hammered).
    watch_delivered: bool,
    pending: VecDeque<ReflectorEvent>,
    failures: u32,
    delay: Option<Duration>,
    min_backoff: Duration,
    max_backoff: Duration,
}

impl Reflector {
    /// A reflector of `path` (e.g. `/api/v1/pods`), optionally filtered by a field selector.
    pub fn new(client: Client, path: impl Into<String>, field_selector: Option<String>) -> Self {
        Self {
            client,
            path: path.into(),
            field_selector,
            store: BTreeMap::new(),
            resource_version: None,
            watch: None,
            watch_delivered: false,
            pending: VecDeque::new(),
            failures: 0,
            delay: None,
            min_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(30),
        }
    }

    /// Retry pacing after failures (default 200 ms doubling up to 30 s).
    pub fn with_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.min_backoff = min;
        self.max_backoff = max.max(min);
        self
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// The objects as last seen.
    pub fn store(&self) -> &BTreeMap<ObjectKey, Value> {
        &self.store
    }

    /// The next change. An `Err` is informational: the reflector recovers on the next call.
    pub async fn next(&mut self) -> Result<ReflectorEvent, Error> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Ok(event);
            }
            if let Some(delay) = self.delay.take() {
                tokio::time::sleep(delay).await;
            }
            let Some(rv) = self.resource_version.clone() else {
                match self.relist().await {
                    Ok(()) => {
                        self.failures = 0;
                        continue;
                    }
                    Err(e) => return Err(self.failed(e)),
                }
            };
            let watch = match &mut self.watch {
                Some(watch) => watch,
                None => {
                    let fs = self.field_selector.as_deref();
                    match self.client.watch(&self.path, &rv, fs).await {
                        Ok(w) => {
                            self.watch_delivered = false;
                            self.watch.insert(w)
                        }
                        Err(Error::Gone { .. }) => {
                            self.resource_version = None;
                            continue;
                        }
                        Err(e) => return Err(self.failed(e)),
                    }
                }
            };
            match watch.next().await {
                None => {
                    self.watch = None;
                    if !self.watch_delivered {
                        self.delay = Some(self.min_backoff);
                    }
                }
                Some(Err(e)) => {
                    self.watch = None;
                    if let Error::Gone { .. } = e {
                        self.resource_version = None;
                        continue;
                    }
                    return Err(self.failed(e));
                }
                Some(Ok(event)) => {
                    self.watch_delivered = true;
                    self.failures = 0;
                    self.apply(event.kind, event.object)?;
                }
            }
        }
    }

    /// Records a failure and schedules the retry.
    fn failed(&mut self, e: Error) -> Error {
        let exp = self.failures.min(16);
        self.failures = self.failures.saturating_add(1);
        let delay = self
            .min_backoff
            .saturating_mul(1 << exp)
            .min(self.max_backoff);
        self.delay = Some(delay);
        e
    }

    fn apply(&mut self, kind: EventType, object: Value) -> Result<(), Error> {
        if let EventType::Error = kind {
            let status = crate::watch::WatchEvent {
                kind,
                object: object.clone(),
            }
            .error_status();
            self.watch = None;
            // Whatever the error, a relist brings the map back to the truth.
            self.resource_version = None;
            return match status {
                Some(Error::Gone { .. }) | None => Ok(()),
                Some(e) => Err(self.failed(e)),
            };
        }
        if let Some(rv) = resource_version(&object) {
            self.resource_version = Some(rv.to_string());
        }
        if kind == EventType::Bookmark {
            return Ok(());
        }
        let key = object_key(&object).ok_or_else(|| Error::Shape {
            what: "watch event object",
            reason: "no metadata.name".into(),
        })?;
        match kind {
            EventType::Deleted => {
                if self.store.remove(&key).is_some() {
                    self.pending.push_back(ReflectorEvent::Deleted(object));
                }
            }
            _ => {
                let event = match self.store.insert(key, object.clone()) {
                    Some(_) => ReflectorEvent::Updated(object),
                    None => ReflectorEvent::Added(object),
                };
                self.pending.push_back(event);
            }
        }
        Ok(())
    }

    /// Lists and diffs against the map.
    async fn relist(&mut self) -> Result<(), Error> {
        self.watch = None;
        let list = self
            .client
            .list(&self.path, self.field_selector.as_deref())
            .await?;
        let mut fresh = BTreeMap::new();
        for item in list.items {
            match object_key(&item) {
                Some(key) => {
                    fresh.insert(key, item);
                }
                None => {
                    tracing::warn!(path = %self.path, "list item without metadata.name skipped")
                }
            }
        }
        for (key, item) in &fresh {
            match self.store.get(key) {
                None => self.pending.push_back(ReflectorEvent::Added(item.clone())),
                Some(old) if old != item => self
                    .pending
                    .push_back(ReflectorEvent::Updated(item.clone())),
                Some(_) => {}
            }
        }
        for (key, old) in std::mem::take(&mut self.store) {
            if !fresh.contains_key(&key) {
                self.pending.push_back(ReflectorEvent::Deleted(old));
            }
        }
        self.pending.push_back(ReflectorEvent::Synced);
        self.store = fresh;
        self.resource_version = Some(list.resource_version);
        Ok(())
    }
}
