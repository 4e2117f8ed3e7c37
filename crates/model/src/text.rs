//! Serde support for the types that have one canonical text form (`Cidr`, `NetworkAddr`,
//! `namespace/name` keys, …): they serialize as that text and deserialize by parsing it, so a
//! bad value is reported by the deserializer at the position of the offending string.

macro_rules! serde_as_text {
    ($($ty:ty => $expecting:literal),* $(,)?) => {$(
        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl serde::de::Visitor<'_> for V {
                    type Value = $ty;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str($expecting)
                    }
                    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<$ty, E> {
                        v.parse().map_err(E::custom)
                    }
                }
                d.deserialize_str(V)
            }
        }
    )*};
}

serde_as_text! {
    crate::addr::Cidr => "a CIDR string (IP or IP/prefix-length)",
    crate::addr::NetworkAddr => "a \"network/IP\" string",
    crate::addr::NetworkCidr => "a \"network/IP/prefix-length\" string",
    crate::names::WorkloadUid => "a workload uid string",
    crate::names::NamespacedHostname => "a \"namespace/hostname\" string",
    crate::names::PolicyKey => "a \"namespace/name\" string",
    crate::identity::SpiffeId => "a \"spiffe://TD/ns/NS/sa/SA\" string",
}
