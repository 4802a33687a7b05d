//! The committed man pages and completions match the CLI definitions.

#[test]
fn man_pages_are_up_to_date() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("man");
    let stale = lego_rl::cmd::generate_docs::stale_docs(
        &dir,
        &<lego_rl::cli::Cli as clap::CommandFactory>::command(),
    )
    .unwrap();
    assert!(
        stale.is_empty(),
        "stale generated docs {stale:?}: regenerate with `cargo run --release -- generate-docs man`"
    );
}

#[test]
fn formats_document_covers_every_schema() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/man/lego-rl-formats.md")).unwrap();
    for (_, schema) in lego_rl::records::KNOWN_SCHEMAS {
        assert!(
            doc.contains(schema),
            "man/lego-rl-formats.md does not document {schema}"
        );
    }
}
