use std::sync::Arc;

use proptest::prelude::*;
use tidemark_core::{BatchBuilder, EventBatch, Schema, Value, MAX_POSITION};

use crate::*;

fn batch() -> EventBatch {
    let schema = Arc::new(Schema::parse_spec("SYMBOL:STRING,PRICE:DOUBLE,N:INTEGER").unwrap());
    let mut b = BatchBuilder::new(schema, 3);
    for i in 0..3 {
        let symbol = if i == 1 {
            Value::Null
        } else {
            Value::String(format!("S{i}"))
        };
        b.push_row(
            i * 10,
            None,
            &[
                symbol,
                Value::Double(i as f64 / 2.0),
                Value::Integer(i as i32),
            ],
        )
        .unwrap();
    }
    b.finish()
}

fn one_frame(bytes: &[u8]) -> Frame<'_> {
    let (frame, used) = decode_frame(bytes, DEFAULT_MAX_FRAME_BYTES)
        .unwrap()
        .unwrap();
    assert_eq!(used, bytes.len());
    frame
}

#[test]
fn append_round_trips_and_checks_the_schema() {
    let batch = batch();
    let mut out = Vec::new();
    encode_append(42, "ticks", &batch, None, false, &mut out).unwrap();
    let frame = one_frame(&out);
    assert_eq!((frame.kind, frame.request_id), (Kind::Append, 42));
    let Request::Append {
        stream,
        schema,
        batch: body,
        producer: None,
        ask_positions: false,
    } = Request::decode(&frame).unwrap()
    else {
        panic!("not an append");
    };
    assert_eq!(stream, "ticks");
    // Field names match case-insensitively, as everywhere else.
    let server_schema =
        Arc::new(Schema::parse_spec("symbol:STRING,price:DOUBLE,n:INTEGER").unwrap());
    let decoded = decode_append_batch(schema, body, &server_schema).unwrap();
    assert_eq!(decoded.len(), 3);
    assert_eq!(decoded.row(1), batch.row(1));
    assert_eq!(decoded.tstart(), batch.tstart());

    // Same types in another order: refused, not silently mixed up.
    let swapped = Arc::new(Schema::parse_spec("SYMBOL:STRING,N:INTEGER,PRICE:DOUBLE").unwrap());
    let err = decode_append_batch(schema, body, &swapped).unwrap_err();
    assert!(err.to_string().contains("schema"), "{err}");
}

#[test]
fn answers_and_small_requests_round_trip() {
    let answers = [
        Response::Ack {
            lsn: 7,
            events: 10_000,
            service_micros: 1_234,
            positions: None,
        },
        Response::Ack {
            lsn: 8,
            events: 3,
            service_micros: 5,
            positions: Some((40, 42)),
        },
        Response::TryLater {
            retry_after_ms: 250,
            message: "too many bytes in flight".into(),
        },
        Response::Error {
            code: ErrorCode::UnknownStream,
            message: "no stream \"x\"".into(),
        },
        Response::Error {
            code: ErrorCode::Other(999),
            message: String::new(),
        },
    ];
    for (id, answer) in answers.iter().enumerate() {
        let mut out = Vec::new();
        answer.encode(id as u64, &mut out).unwrap();
        let frame = one_frame(&out);
        assert_eq!(frame.request_id, id as u64);
        assert_eq!(&Response::decode(&frame).unwrap(), answer);
        assert!(
            Request::decode(&frame).is_err(),
            "an answer is not a request"
        );
    }
    let tagged = Request::Append {
        stream: "s",
        schema: "N:INTEGER",
        batch: b"not decoded here",
        producer: Some((7, u64::MAX)),
        ask_positions: true,
    };
    for request in [Request::Ping, Request::Auth { token: "s3cret" }, tagged] {
        let mut out = Vec::new();
        request.encode(9, &mut out).unwrap();
        assert_eq!(Request::decode(&one_frame(&out)).unwrap(), request);
    }
}

#[test]
fn long_messages_are_cut_at_a_char_boundary() {
    let message = "é".repeat(5000);
    let mut out = Vec::new();
    Response::Error {
        code: ErrorCode::Internal,
        message,
    }
    .encode(1, &mut out)
    .unwrap();
    let Response::Error { message, .. } = Response::decode(&one_frame(&out)).unwrap() else {
        panic!("not an error");
    };
    assert!(message.len() <= 4096 && message.chars().all(|c| c == 'é'));
}

#[test]
fn frames_arrive_in_pieces_and_back_to_back() {
    let mut out = Vec::new();
    Request::Ping.encode(1, &mut out).unwrap();
    Request::Auth { token: "t" }.encode(2, &mut out).unwrap();
    for cut in 0..HEADER_LEN {
        assert_eq!(decode_frame(&out[..cut], 1 << 20).unwrap(), None);
    }
    let (first, used) = decode_frame(&out, 1 << 20).unwrap().unwrap();
    assert_eq!(first.request_id, 1);
    let (second, rest) = decode_frame(&out[used..], 1 << 20).unwrap().unwrap();
    assert_eq!((second.request_id, used + rest), (2, out.len()));
}

#[test]
fn damaged_frames_are_refused() {
    let mut out = Vec::new();
    encode_append(1, "s", &batch(), None, false, &mut out).unwrap();

    let mut flipped = out.clone();
    *flipped.last_mut().unwrap() ^= 1;
    assert_eq!(decode_frame(&flipped, 1 << 20), Err(FrameError::Checksum));

    let mut version = out.clone();
    version[4] = 9;
    assert_eq!(
        decode_frame(&version, 1 << 20),
        Err(FrameError::UnsupportedVersion(9))
    );

    let mut kind = out.clone();
    kind[5] = 0x55;
    assert_eq!(
        decode_frame(&kind, 1 << 20),
        Err(FrameError::UnknownKind(0x55))
    );

    assert!(matches!(
        decode_frame(&out, 32),
        Err(FrameError::TooLarge { .. })
    ));
    assert_eq!(
        decode_frame(&[3, 0, 0, 0], 1 << 20),
        Err(FrameError::TooShort(3))
    );
}

proptest! {
    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let schema = Arc::new(Schema::parse_spec("A:STRING,B:LONG,C:BOOLEAN").unwrap());
        if let Ok(Some((frame, _))) = decode_frame(&bytes, 1 << 20) {
            if let Ok(Request::Append { schema: spec, batch, .. }) = Request::decode(&frame) {
                let _ = decode_append_batch(spec, batch, &schema);
            }
            let _ = Response::decode(&frame);
        }
    }

    #[test]
    fn mutated_appends_never_panic(pos in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let batch = batch();
        let mut out = Vec::new();
        encode_append(1, "s", &batch, None, true, &mut out).unwrap();
        let at = pos.index(out.len() - HEADER_LEN) + HEADER_LEN;
        out[at] = byte;
        // Recompute the checksum so that the mutation reaches the body decoders.
        let crc = crc32c::crc32c(&out[HEADER_LEN..]);
        out[16..20].copy_from_slice(&crc.to_le_bytes());
        let frame = one_frame(&out);
        if let Ok(Request::Append { schema: spec, batch: body, .. }) = Request::decode(&frame) {
            if let Ok(decoded) = decode_append_batch(spec, body, batch.schema()) {
                prop_assert_eq!(decoded.len(), decoded.tstart().len());
            }
        }
    }
}

#[test]
fn a_tagged_append_carries_its_producer_and_sequence() {
    let batch = batch();
    let mut out = Vec::new();
    encode_append(5, "ticks", &batch, Some((42, 9)), true, &mut out).unwrap();
    let frame = one_frame(&out);
    assert_eq!(frame.kind, Kind::TaggedAppend);
    assert!(frame.kind.is_append());
    let Request::Append {
        stream,
        schema,
        batch: body,
        producer,
        ask_positions,
    } = Request::decode(&frame).unwrap()
    else {
        panic!("not an append");
    };
    assert_eq!((stream, producer), ("ticks", Some((42, 9))));
    assert!(ask_positions);
    let decoded = decode_append_batch(schema, body, batch.schema()).unwrap();
    assert_eq!(decoded.row(2), batch.row(2));
    // A tag cut short is an error, not a zero.
    let short = Frame {
        kind: Kind::TaggedAppend,
        flags: FLAG_POSITIONS,
        request_id: 5,
        body: &frame.body[..12],
    };
    assert!(Request::decode(&short).is_err());
}

#[test]
fn subscription_requests_round_trip_and_trailing_bytes_are_refused() {
    let requests = [
        Request::Subscribe {
            stream: "ticks",
            start: Start::After(41),
            credit: 1 << 20,
            follow: true,
        },
        Request::Subscribe {
            stream: "ticks",
            start: Start::Earliest,
            credit: 1,
            follow: false,
        },
        Request::Subscribe {
            stream: "ticks",
            start: Start::FromTime(-5),
            credit: 7,
            follow: true,
        },
        Request::Subscribe {
            stream: "ticks",
            start: Start::Consumer("billing"),
            credit: u32::MAX,
            follow: true,
        },
        Request::Credit { bytes: 4096 },
        Request::Unsubscribe,
        Request::CommitPosition {
            stream: "ticks",
            consumer: "billing",
            position: Some(43),
        },
        Request::CommitPosition {
            stream: "ticks",
            consumer: "billing",
            position: None,
        },
    ];
    for request in requests {
        let mut out = Vec::new();
        request.encode(9, &mut out).unwrap();
        assert_eq!(Request::decode(&one_frame(&out)).unwrap(), request);
        // One byte more in the body: refused, not ignored.
        let frame = one_frame(&out);
        let mut longer = frame.body.to_vec();
        longer.push(0);
        let padded = Frame {
            body: &longer,
            ..frame
        };
        assert!(Request::decode(&padded).is_err(), "{request:?}");
    }
    // A start kind past the four there are.
    let mut out = Vec::new();
    Request::Subscribe {
        stream: "s",
        start: Start::Earliest,
        credit: 1,
        follow: true,
    }
    .encode(1, &mut out)
    .unwrap();
    let frame = one_frame(&out);
    let mut body = frame.body.to_vec();
    body[3] = 4; // after u16 length + "s"
    assert!(Request::decode(&Frame {
        body: &body,
        ..frame
    })
    .is_err());
}

#[test]
fn events_round_trip_with_their_positions_and_lies_are_refused() {
    let batch = batch();
    let mut out = Vec::new();
    encode_events(5, 100, 103, &batch, &mut out).unwrap();
    let frame = one_frame(&out);
    assert_eq!((frame.kind, frame.request_id), (Kind::Events, 5));
    let Response::Events {
        first_position,
        next_position,
        events,
    } = Response::decode(&frame).unwrap()
    else {
        panic!("not EVENTS");
    };
    assert_eq!((first_position, next_position), (100, 103));
    assert_eq!(events.len(), 3);
    assert_eq!(
        (0..3).map(|r| events.position_at(r)).collect::<Vec<_>>(),
        [Some(100), Some(101), Some(102)]
    );
    // Events past the stream's next position, or past the largest position: refused.
    for (first, next) in [(101, 103), (u64::MAX - 1, u64::MAX)] {
        let mut out = Vec::new();
        encode_events(5, first, next, &batch, &mut out).unwrap();
        assert!(
            Response::decode(&one_frame(&out)).is_err(),
            "{first} {next}"
        );
    }
}

/// The bytes of a frame, built by hand from docs/protocol.md rather than by the encoder, so
/// that the tests below pin the wire format and not only agreement with itself.
fn raw_frame(kind: u8, flags: u16, request_id: u64, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(16 + body.len() as u32).to_le_bytes());
    out.push(VERSION);
    out.push(kind);
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&request_id.to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// LSN, events, service time: the ACK body every server sends.
fn ack_body(lsn: u64, events: u64, service_micros: u32) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&lsn.to_le_bytes());
    body.extend_from_slice(&events.to_le_bytes());
    body.extend_from_slice(&service_micros.to_le_bytes());
    body
}

#[test]
fn an_ack_with_positions_says_so_in_its_flags_and_round_trips() {
    let ack = Response::Ack {
        lsn: 117,
        events: 3,
        service_micros: 9,
        positions: Some((40, 42)),
    };
    let mut out = Vec::new();
    ack.encode(4, &mut out).unwrap();
    let mut body = ack_body(117, 3, 9);
    body.extend_from_slice(&40u64.to_le_bytes());
    body.extend_from_slice(&42u64.to_le_bytes());
    assert_eq!(out, raw_frame(0x81, 0x0001, 4, &body));
    let frame = one_frame(&out);
    assert_eq!((frame.kind, frame.flags), (Kind::Ack, FLAG_POSITIONS));
    assert_eq!(Response::decode(&frame).unwrap(), ack);

    // A cluster's split batch: other writers' appends came between its parts, so its
    // positions span more than its events.
    let split = Response::Ack {
        lsn: 9,
        events: 3,
        service_micros: 0,
        positions: Some((10, 20)),
    };
    let mut out = Vec::new();
    split.encode(5, &mut out).unwrap();
    assert_eq!(Response::decode(&one_frame(&out)).unwrap(), split);
}

#[test]
fn a_plain_ack_is_the_old_twenty_bytes_without_flags() {
    // What an older server sends, and what this one sends to an append that did not ask.
    let old = raw_frame(0x81, 0, 6, &ack_body(117, 3, 9));
    let plain = Response::Ack {
        lsn: 117,
        events: 3,
        service_micros: 9,
        positions: None,
    };
    assert_eq!(Response::decode(&one_frame(&old)).unwrap(), plain);
    let mut out = Vec::new();
    plain.encode(6, &mut out).unwrap();
    assert_eq!(out, old);
    // Reserved bits are ignored on read.
    let reserved = raw_frame(0x81, 0xfffe, 6, &ack_body(117, 3, 9));
    assert_eq!(Response::decode(&one_frame(&reserved)).unwrap(), plain);
    // Positions without the flag are bytes too many, not positions.
    let mut body = ack_body(117, 3, 9);
    body.extend_from_slice(&[0; 16]);
    let unflagged = raw_frame(0x81, 0, 6, &body);
    assert!(matches!(
        Response::decode(&one_frame(&unflagged)),
        Err(FrameError::Malformed { .. })
    ));
}

#[test]
fn a_flagged_ack_of_the_wrong_length_or_with_impossible_positions_is_refused() {
    let mut full = ack_body(117, 3, 9);
    full.extend_from_slice(&40u64.to_le_bytes());
    full.extend_from_slice(&42u64.to_le_bytes());
    let mut longer = full.clone();
    longer.push(0);
    // Every length but 36: cut anywhere (the plain 20 bytes included), or one byte more.
    let bodies = (0..full.len())
        .map(|len| full[..len].to_vec())
        .chain([longer]);
    for body in bodies {
        let bytes = raw_frame(0x81, FLAG_POSITIONS, 1, &body);
        let got = Response::decode(&one_frame(&bytes));
        assert!(
            matches!(got, Err(FrameError::Malformed { .. })),
            "{} bytes: {got:?}",
            body.len()
        );
    }
    // Positions that cannot be the events': fewer positions than events, backwards, none
    // for no events, past the largest position.
    for (events, first, last) in [
        (3, 40, 41),
        (1, 42, 40),
        (0, 40, 40),
        (1, MAX_POSITION + 1, MAX_POSITION + 1),
    ] {
        let mut body = ack_body(1, events, 0);
        body.extend_from_slice(&u64::to_le_bytes(first));
        body.extend_from_slice(&u64::to_le_bytes(last));
        let bytes = raw_frame(0x81, FLAG_POSITIONS, 1, &body);
        let got = Response::decode(&one_frame(&bytes));
        assert!(
            matches!(got, Err(FrameError::Malformed { .. })),
            "{events} events at {first}..={last}: {got:?}"
        );
    }
}

#[test]
fn an_append_asks_for_positions_with_flag_bit_0_and_reserved_bits_are_ignored() {
    let batch = batch();
    for (ask, flags) in [(false, 0u16), (true, 1)] {
        for producer in [None, Some((42, 9))] {
            let mut out = Vec::new();
            encode_append(3, "s", &batch, producer, ask, &mut out).unwrap();
            assert_eq!(out[6..8], flags.to_le_bytes(), "{ask} {producer:?}");
            let Request::Append { ask_positions, .. } = Request::decode(&one_frame(&out)).unwrap()
            else {
                panic!("not an append");
            };
            assert_eq!(ask_positions, ask);
        }
    }
    // Another bit, with or without bit 0: only bit 0 asks.
    let mut out = Vec::new();
    encode_append(3, "s", &batch, None, false, &mut out).unwrap();
    for (flags, ask) in [(0x8000u16, false), (0x8001, true)] {
        let frame = Frame {
            flags,
            ..one_frame(&out)
        };
        let Ok(Request::Append { ask_positions, .. }) = Request::decode(&frame) else {
            panic!("not an append");
        };
        assert_eq!(ask_positions, ask, "{flags:#06x}");
    }
}
