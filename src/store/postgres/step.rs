//! How one step of a store call on PostgreSQL ends: done, refused by the
//! contract, failed in the database, or in need of the session's lock.
//! The pool settles each; a transaction's steps return them. It knows no
//! table and no connection.

use crate::error::Error;

/// Why a decision did not go through: the contract refused it, the database
/// failed, or, taken unlocked (a turn decision outside a transaction), it needs the
/// session's lock (nothing was written).
pub(super) enum Fail {
    Refused(Error),
    Db(sqlx::Error),
    Locked,
}

impl From<sqlx::Error> for Fail {
    fn from(e: sqlx::Error) -> Self {
        Fail::Db(e)
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        Fail::Refused(e)
    }
}

pub(super) type Step<T> = std::result::Result<T, Fail>;
