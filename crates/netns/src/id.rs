//! [`NetnsId`], the identity that tells two handles of the same namespace apart from
//! handles of different ones (platform-neutral: it is only numbers).

use std::fmt;

/// Identity of a network namespace: inode and device of its nsfs file.
///
/// Two descriptors refer to the same namespace exactly when their identities are equal.
/// The identity stays stable for the life of the namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetnsId {
    /// Inode number (the number shown in `net:[...]`).
    pub ino: u64,
    /// Device of the nsfs filesystem.
    pub dev: u64,
}

impl fmt::Display for NetnsId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "net:[{}] (dev {})", self.ino, self.dev)
    }
}
