//! Local-config YAML (`LOCAL_XDS_PATH` / `LOCAL_XDS`): `LocalConfig::from_yaml`.
//!
//! Properties: never panics (serde_norway's recursion and alias-expansion limits included);
//! a rejected file's error can be displayed and located; and every workload, service and
//! policy of an accepted file converts model → wire → model without being refused or
//! changed, i.e. the file can express nothing the xDS conversions would lose or refuse.
//! The one expected difference: the file form does not apply xDS defaulting (module docs of
//! `ambit_model::local`), and the only default the file can leave unset is a workload's
//! empty `clusterId`, which comes back from the wire as `DEFAULT_CLUSTER_ID`.
#![no_main]

use ambit_model::workload::DEFAULT_CLUSTER_ID;
use ambit_model::{AddressResource, Authorization, LocalConfig};
use ambit_proto::{security as ps, workload as pw};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let config = match LocalConfig::from_yaml(text) {
        Ok(c) => c,
        Err(e) => {
            let _ = (e.to_string(), e.line(), e.column());
            return;
        }
    };
    let workloads = config.workloads.into_iter().map(|mut w| {
        if w.cluster_id.is_empty() {
            w.cluster_id = DEFAULT_CLUSTER_ID.to_owned();
        }
        AddressResource::Workload(Box::new(w))
    });
    let services = config
        .services
        .into_iter()
        .map(|s| AddressResource::Service(Box::new(s)));
    for model in workloads.chain(services) {
        let wire = pw::Address::from(&model);
        assert_eq!(
            AddressResource::try_from(wire.clone()).as_ref(),
            Ok(&model),
            "local-config {model:?} emitted as {wire:?}"
        );
    }
    for policy in config.policies {
        let wire = ps::Authorization::from(&policy);
        assert_eq!(
            Authorization::try_from(wire.clone()).as_ref(),
            Ok(&policy),
            "local-config {policy:?} emitted as {wire:?}"
        );
    }
});
