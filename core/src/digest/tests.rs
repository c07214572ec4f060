use super::*;
use proptest::prelude::*;

#[test]
fn text_is_lower_case_hex_and_parses_back() {
    let d = WeightsDigest::from_bytes([0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef]);
    assert_eq!(d.to_string(), "0123456789abcdef");
    assert_eq!(format!("{d:?}"), "0123456789abcdef");
    assert_eq!("0123456789abcdef".parse(), Ok(d));
    assert_eq!("0123456789ABCDEF".parse(), Ok(d), "either case reads");
    let full = Blake3Digest::from_blake3(&blake3::hash(b"abc"));
    assert_eq!(full.to_string(), blake3::hash(b"abc").to_hex().as_str());
    assert_eq!(full.to_string().len(), Blake3Digest::HEX_LEN);
    // The weights digest is the first bytes of the same hash.
    let short = WeightsDigest::from_blake3(&blake3::hash(b"abc"));
    assert_eq!(short.to_string(), full.to_string()[..WeightsDigest::HEX_LEN]);
}

#[test]
fn text_of_another_length_or_not_hex_is_refused() {
    let parse = |s: &str| s.parse::<WeightsDigest>();
    assert_eq!(parse(""), Err(DigestParseError::Length { expected: 16, found: 0 }));
    assert_eq!(parse("abc"), Err(DigestParseError::Length { expected: 16, found: 3 }));
    assert_eq!(
        parse(&"0".repeat(64)),
        Err(DigestParseError::Length { expected: 16, found: 64 }),
        "a full digest is not a weights digest"
    );
    assert_eq!(parse("0123456789abcdeg"), Err(DigestParseError::NotHex { found: 'g', at: 15 }));
    assert_eq!(parse(" 123456789abcdef"), Err(DigestParseError::NotHex { found: ' ', at: 0 }));
    assert_eq!(parse("é23456789abcdef"), Err(DigestParseError::NotHex { found: 'é', at: 0 }));
    let e = parse("abc").unwrap_err().to_string();
    assert!(e.contains("16 hex characters") && e.contains("found 3"), "{e}");
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Row {
    #[serde(with = "hex_or_empty")]
    hash: Option<WeightsDigest>,
    piece: Blake3Digest,
}

#[test]
fn as_json_a_digest_is_its_hex_and_none_the_empty_string() {
    let d: WeightsDigest = "00ff00ff00ff00ff".parse().unwrap();
    let piece = Blake3Digest::from_bytes([7; 32]);
    let some = Row { hash: Some(d), piece };
    let text = serde_json::to_string(&some).unwrap();
    assert_eq!(text, format!(r#"{{"hash":"00ff00ff00ff00ff","piece":"{}"}}"#, "07".repeat(32)));
    assert_eq!(serde_json::from_str::<Row>(&text).unwrap(), some);
    let none = Row { hash: None, piece };
    let text = serde_json::to_string(&none).unwrap();
    assert!(text.starts_with(r#"{"hash":"","#), "{text}");
    assert_eq!(serde_json::from_str::<Row>(&text).unwrap(), none);
    // Bad text is an error naming what was expected, never a panic.
    let bad = format!(r#"{{"hash":"xyz","piece":"{}"}}"#, "07".repeat(32));
    let e = serde_json::from_str::<Row>(&bad).unwrap_err().to_string();
    assert!(e.contains("hex"), "{e}");
    assert!(serde_json::from_str::<Row>(r#"{"hash":null,"piece":"07"}"#).is_err());
    assert!(serde_json::from_str::<Blake3Digest>("[1,2,3]").is_err());
}

#[test]
fn in_postcard_a_digest_is_its_bytes() {
    let bytes = [9u8; 32];
    let d = Blake3Digest::from_bytes(bytes);
    // The same bytes as the array itself: no length prefix.
    let enc = postcard::to_stdvec(&d).unwrap();
    assert_eq!(enc, postcard::to_stdvec(&bytes).unwrap());
    assert_eq!(enc.len(), 32);
    assert_eq!(postcard::from_bytes::<Blake3Digest>(&enc).unwrap(), d);
    // Cut short: an error.
    assert!(postcard::from_bytes::<Blake3Digest>(&enc[..31]).is_err());
    // Optional: a tag, then the bytes.
    let row = Row { hash: None, piece: d };
    let enc = postcard::to_stdvec(&row).unwrap();
    assert_eq!(enc.len(), 1 + 32);
    assert_eq!(postcard::from_bytes::<Row>(&enc).unwrap(), row);
    let row = Row { hash: Some(WeightsDigest::from_bytes([1; 8])), piece: d };
    let enc = postcard::to_stdvec(&row).unwrap();
    assert_eq!(enc.len(), 1 + 8 + 32);
    assert_eq!(postcard::from_bytes::<Row>(&enc).unwrap(), row);
    for cut in 0..enc.len() {
        assert!(postcard::from_bytes::<Row>(&enc[..cut]).is_err());
    }
}

#[test]
fn hex_or_empty_writes_nothing_for_none() {
    assert_eq!(HexOrEmpty::<8>(&None).to_string(), "");
    let d = Some(WeightsDigest::from_bytes([0xa0; 8]));
    assert_eq!(HexOrEmpty(&d).to_string(), "a0".repeat(8));
}

proptest! {
    /// Any digest's text and JSON read back as the same digest.
    #[test]
    fn any_digest_round_trips(w in any::<[u8; 8]>(), f in any::<[u8; 32]>(), some: bool) {
        let w = WeightsDigest::from_bytes(w);
        prop_assert_eq!(w.to_string().parse::<WeightsDigest>(), Ok(w));
        let f = Blake3Digest::from_bytes(f);
        prop_assert_eq!(f.to_string().parse::<Blake3Digest>(), Ok(f));
        let row = Row { hash: some.then_some(w), piece: f };
        let text = serde_json::to_string(&row).unwrap();
        prop_assert_eq!(serde_json::from_str::<Row>(&text).unwrap(), row);
    }

    /// Any text parses without a panic, and what parses writes back as its lower case.
    #[test]
    fn any_text_parses_or_is_refused(s in "[0-9a-fA-F]{15,17}|\\PC{0,20}") {
        if let Ok(d) = s.parse::<WeightsDigest>() {
            prop_assert_eq!(d.to_string(), s.to_ascii_lowercase());
        }
    }
}
