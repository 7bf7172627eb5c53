//! A file as a turn stores and lists it: the plain record that the wire
//! types carry (`model::EnqueueRequest`) and the rules fill in. It imports
//! nothing of the crate, so the ground floor may hold it.

use serde::{Deserialize, Serialize};

/// What a file is served as when it is not one of the images we recognize.
pub const OCTET_STREAM: &str = "application/octet-stream";

/// A file as stored with its turn (the turn's `attachments` JSON and a
/// `turn_attachments` row): what the claim and the readback list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stored {
    pub position: u32,
    pub name: String,
    /// What the sender said it is (kept, never trusted).
    pub declared_type: String,
    /// What the broker serves it as: an image type sniffed from its bytes,
    /// else `application/octet-stream`.
    pub content_type: String,
    pub size: u64,
    pub sha256: String,
}

impl Stored {
    /// Whether the file is an image the broker recognized (served as such).
    pub fn is_image(&self) -> bool {
        self.content_type != OCTET_STREAM
    }
}
