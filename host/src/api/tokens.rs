//! The bearer tokens' files in the data directory: the consumers' (`api-token`) and
//! the approvers' (`approver-token`), generated (mode 0600, written whole then renamed)
//! on first start, read as they are after.

/// Read the API token from the data directory, generating it (mode 0600) on first start.
pub fn load_or_create_token(
    data_dir: &std::path::Path,
) -> std::io::Result<(String, std::path::PathBuf)> {
    load_or_create_secret(data_dir, "api-token")
}

/// Read the approver token (`<data>/approver-token`), generating it on first start.
pub fn load_or_create_approver_token(
    data_dir: &std::path::Path,
) -> std::io::Result<(String, std::path::PathBuf)> {
    load_or_create_secret(data_dir, "approver-token")
}

fn load_or_create_secret(
    data_dir: &std::path::Path,
    name: &str,
) -> std::io::Result<(String, std::path::PathBuf)> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = data_dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(t) if !t.trim().is_empty() => return Ok((t.trim().to_string(), path)),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let token = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let tmp = data_dir.join(format!("{name}.{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(token.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    Ok((token, path))
}
