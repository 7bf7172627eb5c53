//! `pbbp2.Frame`, the binary message of Lark's long connection (LARK.md,
//! "Long connection"), as `prost` derived messages: proto2, fields 1–4 and
//! both header fields `required` (always encoded, even when 0 or empty).
//! It knows nothing of sockets or events.

use base64::Engine;

/// `method` of a control frame (ping, pong).
pub const CONTROL: i32 = 0;
/// `method` of a data frame (event, card).
pub const DATA: i32 = 1;

#[derive(Clone, PartialEq, prost::Message)]
pub struct Header {
    #[prost(string, required, tag = "1")]
    pub key: String,
    #[prost(string, required, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Frame {
    #[prost(uint64, required, tag = "1")]
    pub seq_id: u64,
    #[prost(uint64, required, tag = "2")]
    pub log_id: u64,
    #[prost(int32, required, tag = "3")]
    pub service: i32,
    #[prost(int32, required, tag = "4")]
    pub method: i32,
    #[prost(message, repeated, tag = "5")]
    pub headers: Vec<Header>,
    #[prost(string, optional, tag = "6")]
    pub payload_encoding: Option<String>,
    #[prost(string, optional, tag = "7")]
    pub payload_type: Option<String>,
    #[prost(bytes = "vec", optional, tag = "8")]
    pub payload: Option<Vec<u8>>,
    #[prost(string, optional, tag = "9")]
    pub log_id_new: Option<String>,
}

/// The required fields as optional ones: prost fills a missing `required`
/// field with its default, so presence is read through this shape.
#[derive(Clone, PartialEq, prost::Message)]
struct Presence {
    #[prost(uint64, optional, tag = "1")]
    seq_id: Option<u64>,
    #[prost(uint64, optional, tag = "2")]
    log_id: Option<u64>,
    #[prost(int32, optional, tag = "3")]
    service: Option<i32>,
    #[prost(int32, optional, tag = "4")]
    method: Option<i32>,
    #[prost(message, repeated, tag = "5")]
    headers: Vec<HeaderPresence>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct HeaderPresence {
    #[prost(string, optional, tag = "1")]
    key: Option<String>,
    #[prost(string, optional, tag = "2")]
    value: Option<String>,
}

impl Frame {
    /// Decodes a frame, refusing one that is not protobuf or lacks a
    /// required field.
    pub fn decode_checked(bytes: &[u8]) -> Result<Frame, &'static str> {
        use prost::Message;
        let presence = Presence::decode(bytes).map_err(|_| "not a pbbp2 frame")?;
        let complete = presence.seq_id.is_some()
            && presence.log_id.is_some()
            && presence.service.is_some()
            && presence.method.is_some()
            && presence
                .headers
                .iter()
                .all(|h| h.key.is_some() && h.value.is_some());
        if !complete {
            return Err("a required field is missing");
        }
        Frame::decode(bytes).map_err(|_| "not a pbbp2 frame")
    }

    /// `{SeqID:0, LogID:0, service, method:0, headers:[type=ping]}`.
    pub fn ping(service: i32) -> Frame {
        Frame {
            service,
            method: CONTROL,
            headers: vec![header("type", "ping")],
            ..Frame::default()
        }
    }

    /// The value of header `key`, if present.
    pub fn header(&self, key: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|h| h.key == key)
            .map(|h| h.value.as_str())
    }

    /// The acknowledgement of this data frame: the same frame (ids, service,
    /// method, headers) plus `biz_rt`, whose payload is
    /// `{"code":…,"headers":{},"data":"<base64 of answer>"}`.
    pub fn ack(&self, code: u16, answer: &serde_json::Value, biz_rt_ms: u128) -> Frame {
        let data = base64::engine::general_purpose::STANDARD.encode(answer.to_string());
        let payload = serde_json::json!({"code": code, "headers": {}, "data": data});
        let mut headers = self.headers.clone();
        headers.retain(|h| h.key != "biz_rt");
        headers.push(header("biz_rt", &biz_rt_ms.to_string()));
        Frame {
            headers,
            payload: Some(payload.to_string().into_bytes()),
            ..self.clone()
        }
    }
}

pub fn header(key: &str, value: &str) -> Header {
    Header {
        key: key.to_owned(),
        value: value.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    #[test]
    fn a_ping_encodes_its_required_zero_fields() {
        let bytes = Frame::ping(7).encode_to_vec();
        // SeqID 0, LogID 0, service 7, method 0, then the header.
        assert_eq!(&bytes[..8], &[0x08, 0, 0x10, 0, 0x18, 7, 0x20, 0]);
        let back = Frame::decode_checked(&bytes).unwrap();
        assert_eq!(back.header("type"), Some("ping"));
        assert_eq!(back.service, 7);
    }

    #[test]
    fn a_frame_missing_a_required_field_does_not_decode() {
        // Only SeqID (field 1) and LogID (field 2).
        assert!(Frame::decode_checked(&[0x08, 1, 0x10, 2][..]).is_err());
        assert!(Frame::decode_checked(&b"garbage\xff\xff"[..]).is_err());
        // A header without its value.
        let mut bytes = Frame::ping(1).encode_to_vec();
        let whole = Frame::decode_checked(&bytes).unwrap();
        assert_eq!(whole.header("type"), Some("ping"));
        bytes.truncate(8);
        bytes.extend([0x2a, 6, 0x0a, 4, b't', b'y', b'p', b'e']);
        assert!(Frame::decode_checked(&bytes).is_err());
    }

    #[test]
    fn an_ack_keeps_the_frame_and_carries_base64_data() {
        let frame = Frame {
            seq_id: 3,
            log_id: 4,
            service: 5,
            method: DATA,
            headers: vec![header("type", "event"), header("message_id", "m")],
            payload: Some(b"{}".to_vec()),
            ..Frame::default()
        };
        let ack = frame.ack(200, &serde_json::json!({}), 12);
        assert_eq!((ack.seq_id, ack.log_id, ack.service), (3, 4, 5));
        assert_eq!(ack.header("biz_rt"), Some("12"));
        assert_eq!(ack.header("message_id"), Some("m"));
        let payload: serde_json::Value = serde_json::from_slice(&ack.payload.unwrap()).unwrap();
        assert_eq!(payload["code"], 200);
        assert_eq!(payload["data"], "e30=");
    }
}
