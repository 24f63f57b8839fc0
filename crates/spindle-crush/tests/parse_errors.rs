//! Malformed text maps are rejected with an error that names the line and what was wrong.

use spindle_crush::{text, CrushError};

const GOOD_HEADER: &str = "device 0 osd.0\ndevice 1 osd.1\ntype 0 osd\ntype 1 root\n";

fn expect_error(map: &str, line: usize, needle: &str) {
    match text::parse_text(map) {
        Ok(_) => panic!("accepted a malformed map:\n{map}"),
        Err(CrushError::Parse { line: got, message }) => {
            assert_eq!(got, line, "wrong line for error '{message}' in:\n{map}");
            assert!(
                message.contains(needle),
                "error '{message}' does not mention '{needle}'"
            );
        }
        Err(other) => panic!("expected a parse error, got {other}"),
    }
}

fn with_bucket(body: &str) -> String {
    format!("{GOOD_HEADER}root r {{\n{body}}}\n")
}

#[test]
fn unknown_top_level_keyword() {
    expect_error("device 0 osd.0\nbogus\n", 2, "found end of file");
    expect_error("device 0 osd.0\n{ }\n", 2, "expected 'tunable'");
}

#[test]
fn device_without_id() {
    expect_error("device osd.0\n", 1, "expected device id");
}

#[test]
fn negative_device_id() {
    expect_error("device -3 osd.0\n", 1, "out of range");
}

#[test]
fn unknown_tunable() {
    expect_error("tunable choose_everything 3\n", 1, "not recognized");
}

#[test]
fn bucket_of_undefined_type() {
    expect_error(
        &format!("{GOOD_HEADER}rack r {{\n\tid -1\n\talg straw2\n}}\n"),
        5,
        "bucket type 'rack' is not defined",
    );
}

#[test]
fn unknown_bucket_algorithm() {
    expect_error(
        &with_bucket("\tid -1\n\talg straw3\n"),
        7,
        "unknown bucket alg 'straw3'",
    );
}

#[test]
fn bucket_without_algorithm() {
    expect_error(
        &with_bucket("\tid -1\n\titem osd.0 weight 1.0\n"),
        5,
        "has no 'alg' line",
    );
}

#[test]
fn item_not_defined() {
    expect_error(
        &with_bucket("\tid -1\n\talg straw2\n\titem osd.7 weight 1.0\n"),
        8,
        "item 'osd.7' in bucket 'r' is not defined",
    );
}

#[test]
fn bad_weight() {
    expect_error(
        &with_bucket("\tid -1\n\talg straw2\n\titem osd.0 weight heavy\n"),
        8,
        "expected item weight",
    );
    expect_error(
        &with_bucket("\tid -1\n\talg straw2\n\titem osd.0 weight 1000\n"),
        8,
        "device weight limited",
    );
}

#[test]
fn uniform_bucket_with_unequal_weights() {
    expect_error(
        &with_bucket("\tid -1\n\talg uniform\n\titem osd.0 weight 1.0\n\titem osd.1 weight 2.0\n"),
        9,
        "uniform bucket items must all have identical weights",
    );
}

#[test]
fn duplicate_bucket_id_and_name() {
    let map = format!(
        "{GOOD_HEADER}root a {{\n\tid -1\n\talg straw2\n}}\nroot b {{\n\tid -1\n\talg straw2\n}}\n"
    );
    expect_error(&map, 9, "duplicate bucket id -1");
    let map = format!(
        "{GOOD_HEADER}root a {{\n\tid -1\n\talg straw2\n}}\nroot a {{\n\tid -2\n\talg straw2\n}}\n"
    );
    expect_error(&map, 9, "already defined");
}

#[test]
fn unterminated_bucket() {
    expect_error(
        &format!("{GOOD_HEADER}root r {{\n\tid -1\n\talg straw2\n"),
        7,
        "found end of file",
    );
}

fn with_rule(steps: &str) -> String {
    format!(
        "{GOOD_HEADER}root r {{\n\tid -1\n\talg straw2\n\titem osd.0 weight 1.0\n}}\nrule x {{\n\tid 0\n\ttype replicated\n{steps}}}\n"
    )
}

#[test]
fn rule_step_errors() {
    expect_error(
        &with_rule("\tstep take nowhere\n\tstep emit\n"),
        13,
        "item 'nowhere' not defined",
    );
    expect_error(
        &with_rule("\tstep take r\n\tstep choose firstn 0 type host\n"),
        14,
        "type 'host' not defined",
    );
    expect_error(
        &with_rule("\tstep take r\n\tstep choose sideways 0 type osd\n"),
        14,
        "expected 'firstn' or 'indep'",
    );
    expect_error(&with_rule("\tstep jump\n"), 13, "unknown step 'jump'");
    expect_error(
        &with_rule("\tstep take r class ssd\n"),
        13,
        "class 'ssd' does not exist",
    );
}

#[test]
fn rule_type_and_duplicates() {
    let map = format!("{GOOD_HEADER}rule x {{\n\tid 0\n\ttype mirrored\n}}\n");
    expect_error(&map, 7, "expected rule type 'replicated' or 'erasure'");
    let two = format!("{GOOD_HEADER}rule x {{\n\tid 0\n\ttype replicated\n}}\nrule y {{\n\tid 0\n\ttype replicated\n}}\n");
    expect_error(&two, 9, "rule 0 already exists");
}

#[test]
fn buckets_after_rules_are_rejected() {
    let map = format!("{GOOD_HEADER}rule x {{\n\tid 0\n\ttype replicated\n}}\nroot r {{\n\tid -1\n\talg straw2\n}}\n");
    expect_error(&map, 9, "buckets must be defined before rules");
}

#[test]
fn choose_args_are_rejected_clearly() {
    expect_error(
        &format!("{GOOD_HEADER}choose_args 0 {{\n}}\n"),
        5,
        "choose_args",
    );
}

#[test]
fn binary_garbage_is_an_error_not_a_panic() {
    let mut bytes = 0x0001_0000u32.to_le_bytes().to_vec();
    bytes.extend_from_slice(&[0xff; 7]);
    assert!(spindle_crush::binary::decode(&bytes).is_err());
    for len in 0..64 {
        let truncated: Vec<u8> = (0..len).map(|i| (i * 37) as u8).collect();
        let _ = spindle_crush::load_map(&truncated); // must not panic
    }
}
