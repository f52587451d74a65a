//! Wall-clock times for people: milliseconds since the Unix epoch as `2026-11-30 09:42:57` (UTC),
//! shared by meshctl's text and meshd's status page.

/// `2026-11-30 09:42:57` (UTC), or `<ms> ms` for a time the calendar cannot hold.
pub fn utc_seconds(ms: u64) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    match time::OffsetDateTime::from_unix_timestamp_nanos(nanos) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        ),
        Err(_) => format!("{ms} ms"),
    }
}
