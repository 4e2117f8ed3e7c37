//! `baggage` header: the W3C list syntax restricted to the keys ztunnel uses.

use std::fmt::Write as _;

/// Longest `baggage` value parsed; W3C baggage caps the whole header at 8192 bytes.
pub const MAX_BAGGAGE_LEN: usize = 8192;
/// W3C caps baggage at 180 list members.
const MAX_MEMBERS: usize = 180;

/// The kind of controller a workload belongs to (`k8s.<kind>.name`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkloadKind {
    Deployment,
    CronJob,
    Pod,
    Job,
}

impl WorkloadKind {
    const ALL: [WorkloadKind; 4] = [
        WorkloadKind::Deployment,
        WorkloadKind::CronJob,
        WorkloadKind::Pod,
        WorkloadKind::Job,
    ];

    fn key(self) -> &'static str {
        match self {
            WorkloadKind::Deployment => "k8s.deployment.name",
            WorkloadKind::CronJob => "k8s.cronjob.name",
            WorkloadKind::Pod => "k8s.pod.name",
            WorkloadKind::Job => "k8s.job.name",
        }
    }
}

/// Workload metadata carried in `baggage`. Empty strings mean "absent".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Baggage {
    pub cluster_id: String,
    pub namespace: String,
    /// Controller kind of `workload_name`; `None` when no `k8s.<kind>.name` key was seen.
    pub workload_kind: Option<WorkloadKind>,
    pub workload_name: String,
    pub service_name: String,
    pub service_version: String,
    pub region: String,
    pub zone: String,
}

/// Why a `baggage` value was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BaggageError {
    #[error("baggage header longer than {MAX_BAGGAGE_LEN} bytes")]
    TooLong,
    #[error("baggage header has more than {MAX_MEMBERS} members")]
    TooManyMembers,
    #[error("baggage member {index} is not `key=value`")]
    MalformedMember { index: usize },
}

impl Baggage {
    /// Parses a `baggage` value. Unknown keys are ignored (other tracers add their own),
    /// W3C member properties (`;…`) are dropped, and the last occurrence of a key wins.
    pub fn parse(s: &str) -> Result<Baggage, BaggageError> {
        if s.len() > MAX_BAGGAGE_LEN {
            return Err(BaggageError::TooLong);
        }
        let mut out = Baggage::default();
        for (index, member) in s.split(',').enumerate() {
            if index >= MAX_MEMBERS {
                return Err(BaggageError::TooManyMembers);
            }
            let member = member.trim_matches([' ', '\t']);
            if member.is_empty() {
                continue;
            }
            let kv = member.split_once(';').map_or(member, |(kv, _props)| kv);
            let (k, v) = kv
                .split_once('=')
                .ok_or(BaggageError::MalformedMember { index })?;
            let (k, v) = (k.trim_matches([' ', '\t']), v.trim_matches([' ', '\t']));
            if k.is_empty() {
                return Err(BaggageError::MalformedMember { index });
            }
            let slot = match k {
                "k8s.cluster.name" => &mut out.cluster_id,
                "k8s.namespace.name" => &mut out.namespace,
                "service.name" => &mut out.service_name,
                "service.version" => &mut out.service_version,
                "cloud.region" => &mut out.region,
                "cloud.availability_zone" => &mut out.zone,
                _ => match WorkloadKind::ALL.into_iter().find(|w| w.key() == k) {
                    Some(kind) => {
                        out.workload_kind = Some(kind);
                        &mut out.workload_name
                    }
                    None => continue,
                },
            };
            v.clone_into(slot);
        }
        Ok(out)
    }

    /// Encodes the non-empty fields in a fixed order, as ztunnel sends them.
    pub fn encode(&self) -> String {
        let workload_key = self.workload_kind.unwrap_or(WorkloadKind::Deployment).key();
        let fields = [
            ("k8s.cluster.name", &self.cluster_id),
            ("k8s.namespace.name", &self.namespace),
            (workload_key, &self.workload_name),
            ("service.name", &self.service_name),
            ("service.version", &self.service_version),
            ("cloud.region", &self.region),
            ("cloud.availability_zone", &self.zone),
        ];
        let mut out = String::with_capacity(128);
        for (k, v) in fields.into_iter().filter(|(_, v)| !v.is_empty()) {
            if !out.is_empty() {
                out.push(',');
            }
            // Writing to a String cannot fail.
            let _ = write!(out, "{k}={v}");
        }
        out
    }

    /// True when no field is set.
    pub fn is_empty(&self) -> bool {
        *self == Baggage::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(f: impl FnOnce(&mut Baggage)) -> Baggage {
        let mut out = Baggage::default();
        f(&mut out);
        out
    }

    #[test]
    fn parse_table() {
        let cases: Vec<(String, Result<Baggage, BaggageError>)> = vec![
            ("".into(), Ok(Baggage::default())),
            (
                "k8s.namespace.name=default,k8s.deployment.name=pod1-deploy,\
                 service.name=pod1-app,service.version=v1"
                    .into(),
                Ok(b(|b| {
                    b.namespace = "default".into();
                    b.workload_kind = Some(WorkloadKind::Deployment);
                    b.workload_name = "pod1-deploy".into();
                    b.service_name = "pod1-app".into();
                    b.service_version = "v1".into();
                })),
            ),
            (
                " k8s.cluster.name = c1 ;prop=x, ,k8s.job.name=j,cloud.region=r,\
                 cloud.availability_zone=z,other=ignored"
                    .into(),
                Ok(b(|b| {
                    b.cluster_id = "c1".into();
                    b.workload_kind = Some(WorkloadKind::Job);
                    b.workload_name = "j".into();
                    b.region = "r".into();
                    b.zone = "z".into();
                })),
            ),
            (
                "k8s.pod.name=a,k8s.cronjob.name=b".into(),
                Ok(b(|b| {
                    b.workload_kind = Some(WorkloadKind::CronJob);
                    b.workload_name = "b".into();
                })),
            ),
            (
                "service.name".into(),
                Err(BaggageError::MalformedMember { index: 0 }),
            ),
            (
                "a=b,=c".into(),
                Err(BaggageError::MalformedMember { index: 1 }),
            ),
            ("a=b,".repeat(200), Err(BaggageError::TooManyMembers)),
            ("x".repeat(MAX_BAGGAGE_LEN + 1), Err(BaggageError::TooLong)),
        ];
        for (input, want) in cases {
            assert_eq!(Baggage::parse(&input), want, "input {input:?}");
        }
    }

    #[test]
    fn encode_round_trips_and_skips_empty() {
        let full = b(|b| {
            b.cluster_id = "Kubernetes".into();
            b.namespace = "default".into();
            b.workload_kind = Some(WorkloadKind::Pod);
            b.workload_name = "p".into();
            b.service_name = "svc".into();
            b.service_version = "v2".into();
            b.region = "eu".into();
            b.zone = "eu-1".into();
        });
        let cases = [
            (Baggage::default(), ""),
            (b(|b| b.namespace = "ns".into()), "k8s.namespace.name=ns"),
            (
                full.clone(),
                "k8s.cluster.name=Kubernetes,k8s.namespace.name=default,k8s.pod.name=p,\
                 service.name=svc,service.version=v2,cloud.region=eu,cloud.availability_zone=eu-1",
            ),
        ];
        for (baggage, want) in cases {
            assert_eq!(baggage.encode(), want);
            assert_eq!(Baggage::parse(want).unwrap(), baggage);
        }
    }
}
