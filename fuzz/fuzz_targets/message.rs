//! Message bodies and cluster maps from arbitrary bytes: decoding must never panic, and
//! whatever decodes must re-encode to a body that decodes to the same message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spindle_proto::Msg;

fuzz_target!(|data: &[u8]| {
    let Some((&k, body)) = data.split_first() else { return };
    // Kinds live in 1..=41; spread the first byte over them (and some invalid ones).
    let kind = u16::from(k % 48);
    if let Ok(msg) = Msg::decode(kind, body) {
        let again = msg.encode();
        assert_eq!(Msg::decode(kind, &again).ok(), Some(msg));
    }
    let _ = spindle_map::ClusterMap::decode(data);
});
