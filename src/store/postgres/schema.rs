//! The table's shape and version (docs/behaviour.md §22): created when missing and
//! allowed, refused by name when it is another version or not idemgate's, and never
//! altered or dropped.

use tokio_postgres::{Client, GenericClient};

use crate::store::StoreError;

/// The version this build reads and writes, in the table's comment.
pub(super) const VERSION: u32 = 1;
const MARK: &str = "idemgate_schema";

/// Why the table cannot be used: the process stops at start (exit 1), naming it.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error(
        "table {0} does not exist and store.create_table is false; create it (docs/stores.md gives the CREATE TABLE) or set create_table: true"
    )]
    Missing(String),
    #[error(
        "table {table} is idemgate_schema {found}, and this idemgate reads version {VERSION}; it was not changed"
    )]
    OtherVersion { table: String, found: String },
    #[error(
        "table {0} exists and is not idemgate's (no 'idemgate_schema {VERSION}' comment); it was not changed: name another store.table"
    )]
    Foreign(String),
    #[error("table {table}: {source}")]
    Database {
        table: String,
        #[source]
        source: super::conn::PgError,
    },
}

/// What the table's comment says: nothing (no table), or its text.
enum Found {
    NoTable,
    Comment(Option<String>),
}

async fn find(client: &impl GenericClient, table: &str) -> Result<Found, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT to_regclass($1)::oid IS NOT NULL, obj_description(to_regclass($1)::oid, 'pg_class')",
            &[&table],
        )
        .await?;
    Ok(if row.get::<_, bool>(0) {
        Found::Comment(row.get(1))
    } else {
        Found::NoTable
    })
}

fn judge(table: &str, comment: Option<String>) -> Result<(), SchemaError> {
    let expected = format!("{MARK} {VERSION}");
    match comment {
        Some(text) if text.trim() == expected => Ok(()),
        Some(text) if text.trim().starts_with(MARK) => Err(SchemaError::OtherVersion {
            table: table.to_owned(),
            found: text.trim()[MARK.len()..].trim().to_owned(),
        }),
        _ => Err(SchemaError::Foreign(table.to_owned())),
    }
}

/// The statements that make the table, as docs/stores.md gives them to operators who
/// create it themselves.
pub fn create_statements(table: &str) -> Vec<String> {
    let index = format!("{}_expires_at", table.rsplit('.').next().unwrap_or(table));
    // An index name is at most 63 bytes; the table part is checked to be at most 63.
    let index: String = index.chars().take(63).collect();
    vec![
        format!(
            "CREATE TABLE {table} (\
             id text PRIMARY KEY, \
             value bytea NOT NULL, \
             expires_at bigint NOT NULL, \
             owner bytea, \
             lease_until bigint)"
        ),
        // Records are stored as they are: sealed ones do not compress, and compressing
        // the others costs CPU on every write for little.
        format!("ALTER TABLE {table} ALTER COLUMN value SET STORAGE EXTERNAL"),
        format!("CREATE INDEX {index} ON {table} (expires_at)"),
        format!("COMMENT ON TABLE {table} IS '{MARK} {VERSION}'"),
    ]
}

/// Checks the table, creating it first when it is missing and `create` allows. Several
/// replicas starting at once create it once: the creation holds an advisory lock
/// named after the table and looks again under it, in a transaction begun once the lock
/// is held. (Begun before, it would look with the catalog it had before waiting: a
/// replica that waited for another's creation would find no table and fail to create
/// it again, and exit.)
pub(super) async fn ensure(
    client: &mut Client,
    table: &str,
    create: bool,
) -> Result<(), SchemaError> {
    let db = |source: tokio_postgres::Error| SchemaError::Database {
        table: table.to_owned(),
        source: source.into(),
    };
    match find(client, table).await.map_err(db)? {
        Found::Comment(comment) => return judge(table, comment),
        Found::NoTable if !create => return Err(SchemaError::Missing(table.to_owned())),
        Found::NoTable => {}
    }
    // A session lock: the caller closes the connection on an error, which releases it.
    client
        .execute(
            "SELECT pg_advisory_lock(hashtext('idemgate table ' || $1))",
            &[&table],
        )
        .await
        .map_err(db)?;
    let created = create_under_lock(client, table).await;
    client
        .execute(
            "SELECT pg_advisory_unlock(hashtext('idemgate table ' || $1))",
            &[&table],
        )
        .await
        .map_err(db)?;
    created
}

/// Looks again and creates the table if it is still missing, in one transaction.
async fn create_under_lock(client: &mut Client, table: &str) -> Result<(), SchemaError> {
    let db = |source: tokio_postgres::Error| SchemaError::Database {
        table: table.to_owned(),
        source: source.into(),
    };
    let tx = client.transaction().await.map_err(db)?;
    if let Found::Comment(comment) = find(&tx, table).await.map_err(db)? {
        return judge(table, comment);
    }
    for statement in create_statements(table) {
        tx.batch_execute(&statement).await.map_err(db)?;
    }
    tx.commit().await.map_err(db)?;
    tracing::info!(table, version = VERSION, "postgres store: table created");
    Ok(())
}

/// The start-up warning of docs/behaviour.md §22, when no standby is synchronous.
pub(super) async fn replication_warning(client: &Client) -> Result<Option<String>, StoreError> {
    let row = client
        .query_one("SELECT current_setting('synchronous_standby_names')", &[])
        .await
        .map_err(super::conn::failed)?;
    let names: String = row.get(0);
    Ok(names.trim().is_empty().then(|| {
        "postgres synchronous_standby_names is empty: a failover to an asynchronous standby can lose acknowledged claims, and their retries would execute again".to_owned()
    }))
}
