//! Feeds arbitrary bytes, in arbitrary chunks, to the frame decoder: it must never panic,
//! and every frame it returns must re-encode to exactly the bytes it came from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spindle_proto::{encode_frame, FrameDecoder};

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, bytes)) = data.split_first() else { return };
    let chunk = usize::from(chunk).max(1);
    let mut decoder = FrameDecoder::new(1 << 20);
    let mut consumed = 0usize;
    for piece in bytes.chunks(chunk) {
        decoder.push(piece);
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => {
                    let mut again = Vec::new();
                    encode_frame(frame.kind, frame.request_id, frame.epoch, &frame.payload, &mut again);
                    assert_eq!(&bytes[consumed..consumed + again.len()], &again[..]);
                    consumed += again.len();
                }
                Ok(None) | Err(_) => break,
            }
        }
    }
});
