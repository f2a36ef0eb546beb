//! The fact core on PostgreSQL: a real cluster started by `tests/common/pg.rs`.

mod common;

use common::pg;

#[test]
fn the_harness_gives_each_test_a_fresh_database() {
    let Some(a) = pg::db() else { return };
    let Some(b) = pg::db() else { return };
    assert_ne!(a.name, b.name);
    a.psql("CREATE TABLE only_here (x BIGINT)");
    assert_eq!(
        a.psql("SELECT count(*) FROM pg_tables WHERE tablename = 'only_here'"),
        "1"
    );
    assert_eq!(
        b.psql("SELECT count(*) FROM pg_tables WHERE tablename = 'only_here'"),
        "0"
    );
}
