//! [`Guid`]: the identifiers HNS names namespaces and endpoints by, parsed from text (the
//! form containerd and HNS print, braces and case tolerated) and turned into the four-field
//! layout Win32 takes (`Data1`–`Data3` little-endian integers, `Data4` bytes). windows-sys'
//! `GUID` has only `from_u128`, so parsing is ours; it is platform-neutral and tested on
//! Linux.

use std::fmt;
use std::str::FromStr;

/// A GUID, stored as the 128-bit number its canonical text spells.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Guid(u128);

/// Text that is not a GUID; names the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a GUID (expected xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")]
pub struct GuidError(pub String);

impl Guid {
    /// The GUID whose canonical text is this number in hex.
    pub const fn from_u128(v: u128) -> Self {
        Self(v)
    }

    /// The number.
    pub const fn as_u128(self) -> u128 {
        self.0
    }

    /// The Win32 fields: `(Data1, Data2, Data3, Data4)`.
    pub const fn fields(self) -> (u32, u16, u16, [u8; 8]) {
        let v = self.0;
        let d4 = (v as u64).to_be_bytes();
        ((v >> 96) as u32, (v >> 80) as u16, (v >> 64) as u16, d4)
    }

    /// From the Win32 fields.
    pub const fn from_fields(d1: u32, d2: u16, d3: u16, d4: [u8; 8]) -> Self {
        Self(
            ((d1 as u128) << 96)
                | ((d2 as u128) << 80)
                | ((d3 as u128) << 64)
                | u64::from_be_bytes(d4) as u128,
        )
    }
}

impl FromStr for Guid {
    type Err = GuidError;

    /// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, any case, optionally in braces, surrounding
    /// whitespace ignored. Nothing else (no missing dashes, no extra characters).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = || GuidError(text.to_owned());
        let t = text.trim();
        let t = match (t.strip_prefix('{'), t.ends_with('}')) {
            (Some(inner), true) => &inner[..inner.len() - 1],
            (None, false) => t,
            _ => return Err(err()),
        };
        let groups: Vec<&str> = t.split('-').collect();
        let lens = [8, 4, 4, 4, 12];
        if groups.len() != lens.len()
            || groups
                .iter()
                .zip(lens)
                .any(|(g, n)| g.len() != n || !g.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(err());
        }
        u128::from_str_radix(&groups.concat(), 16)
            .map(Self)
            .map_err(|_| err())
    }
}

impl fmt::Display for Guid {
    /// Canonical form: lower case, no braces (as HNS prints `ID`s).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (d1, d2, d3, d4) = self.fields();
        write!(f, "{d1:08x}-{d2:04x}-{d3:04x}-{:02x}{:02x}-", d4[0], d4[1])?;
        d4[2..].iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl serde::Serialize for Guid {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Guid {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const TEXT: &str = "0b1c5a7e-3d2f-4e6a-9b8c-1d2e3f405162";

    #[test]
    fn parses_any_accepted_spelling_to_one_value() {
        let want = Guid::from_u128(0x0b1c5a7e_3d2f_4e6a_9b8c_1d2e3f405162);
        for text in [
            TEXT,
            "0B1C5A7E-3D2F-4E6A-9B8C-1D2E3F405162",
            "{0b1c5a7e-3d2f-4e6a-9b8c-1d2e3f405162}",
            " {0B1C5A7E-3d2f-4E6A-9b8c-1D2E3F405162}\n",
        ] {
            assert_eq!(text.parse::<Guid>().unwrap(), want, "{text:?}");
        }
        assert_eq!(want.to_string(), TEXT);
    }

    #[test]
    fn fields_are_the_win32_layout() {
        let g: Guid = TEXT.parse().unwrap();
        let (d1, d2, d3, d4) = g.fields();
        assert_eq!((d1, d2, d3), (0x0b1c5a7e, 0x3d2f, 0x4e6a));
        assert_eq!(d4, [0x9b, 0x8c, 0x1d, 0x2e, 0x3f, 0x40, 0x51, 0x62]);
        assert_eq!(Guid::from_fields(d1, d2, d3, d4), g);
    }

    #[test]
    fn rejects_what_is_not_a_guid() {
        for bad in [
            "",
            "not-a-guid",
            "0b1c5a7e3d2f4e6a9b8c1d2e3f405162",
            "{0b1c5a7e-3d2f-4e6a-9b8c-1d2e3f405162",
            "0b1c5a7e-3d2f-4e6a-9b8c-1d2e3f405162}",
            "0b1c5a7e-3d2f-4e6a-9b8c-1d2e3f40516",
            "0b1c5a7e-3d2f-4e6a-9b8c-1d2e3f4051620",
            "0b1c5a7g-3d2f-4e6a-9b8c-1d2e3f405162",
            "+b1c5a7e-3d2f-4e6a-9b8c-1d2e3f405162",
            "0b1c5a7e-3d2f-4e6a-9b8c-1d2e-3f405162",
        ] {
            let err = bad.parse::<Guid>().unwrap_err();
            assert_eq!(err.0, bad);
        }
    }

    #[test]
    fn serde_uses_the_text_form() {
        let g: Guid = TEXT.parse().unwrap();
        assert_eq!(serde_json::to_string(&g).unwrap(), format!("\"{TEXT}\""));
        let back: Guid = serde_json::from_str(&format!("\"{}\"", TEXT.to_uppercase())).unwrap();
        assert_eq!(back, g);
        assert!(serde_json::from_str::<Guid>("\"x\"").is_err());
    }
}
