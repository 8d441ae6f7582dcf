//! What the repository's `Dockerfile` says about the image it ships: the
//! instructions of its final stage (base, copies, environment, user,
//! entrypoint), read from the file so the assembled image cannot diverge.

use anyhow::Context as _;

/// The final stage of a Dockerfile.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FinalStage {
    /// The base image (`FROM`), without its digest.
    pub base: String,
    /// Each `COPY`: its sources and its destination.
    pub copies: Vec<(Vec<String>, String)>,
    /// `ENV` settings as `NAME=value`, in order.
    pub env: Vec<String>,
    /// `USER`.
    pub user: String,
    /// `ENTRYPOINT`, exec form.
    pub entrypoint: Vec<String>,
}

impl FinalStage {
    /// The final stage of the repository's Dockerfile.
    pub fn of_repository() -> anyhow::Result<FinalStage> {
        let path = crate::repo_path("Dockerfile");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        FinalStage::parse(&text).with_context(|| format!("in {}", path.display()))
    }

    /// Parses `text`, a Dockerfile; only the last stage counts.
    pub fn parse(text: &str) -> anyhow::Result<FinalStage> {
        let mut stage = None;
        for line in instructions(text) {
            let (keyword, args) = line.split_once(char::is_whitespace).unwrap_or((&line, ""));
            let args = args.trim();
            match keyword.to_ascii_uppercase().as_str() {
                "FROM" => {
                    stage = Some(FinalStage {
                        base: image_reference(args).0.to_owned(),
                        ..FinalStage::default()
                    });
                }
                keyword => {
                    let stage = stage.as_mut().context("an instruction before FROM")?;
                    stage.apply(keyword, args)?;
                }
            }
        }
        let stage = stage.context("no FROM")?;
        anyhow::ensure!(
            !stage.entrypoint.is_empty(),
            "the final stage has no ENTRYPOINT"
        );
        Ok(stage)
    }

    fn apply(&mut self, keyword: &str, args: &str) -> anyhow::Result<()> {
        match keyword {
            "COPY" => {
                let words: Vec<String> = args
                    .split_whitespace()
                    .filter(|w| !w.starts_with("--"))
                    .map(str::to_owned)
                    .collect();
                let (dest, sources) = words.split_last().context("COPY without a destination")?;
                self.copies.push((sources.to_vec(), dest.clone()));
            }
            "ENV" => self.env.extend(env_settings(args)?),
            "USER" => args.clone_into(&mut self.user),
            "ENTRYPOINT" => {
                self.entrypoint = serde_json::from_str(args)
                    .with_context(|| format!("ENTRYPOINT is not in exec form: {args}"))?;
            }
            _ => {}
        }
        Ok(())
    }
}

/// The image a `FROM` names (`name[:tag][@digest] [AS stage]`): the name
/// with its tag, and the digest when the reference is pinned by one.
pub fn image_reference(from_args: &str) -> (&str, Option<&str>) {
    let image = from_args.split_whitespace().next().unwrap_or_default();
    match image.split_once('@') {
        Some((name, digest)) => (name, Some(digest)),
        None => (image, None),
    }
}

/// The arguments of every `FROM` in `text`, in order (`name[@digest] [AS
/// stage]`; see [`image_reference`]).
pub fn from_args(text: &str) -> Vec<String> {
    instructions(text)
        .into_iter()
        .filter_map(|line| {
            let (keyword, args) = line.split_once(char::is_whitespace)?;
            keyword
                .eq_ignore_ascii_case("FROM")
                .then(|| args.trim().to_owned())
        })
        .collect()
}

/// The instructions of a Dockerfile, continuation lines joined, comments
/// and blank lines left out.
fn instructions(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                out.push(std::mem::take(&mut current));
            }
        }
    }
    if !current.trim().is_empty() {
        out.push(current);
    }
    out
}

/// `ENV NAME=value NAME2=value2` or `ENV NAME value`, quotes removed.
fn env_settings(args: &str) -> anyhow::Result<Vec<String>> {
    let unquote = |v: &str| v.trim_matches('"').to_owned();
    match args.split_once(char::is_whitespace) {
        Some((name, value)) if !name.contains('=') => {
            Ok(vec![format!("{name}={}", unquote(value.trim()))])
        }
        _ => args
            .split_whitespace()
            .map(|pair| {
                let (name, value) = pair
                    .split_once('=')
                    .with_context(|| format!("ENV {pair}: expected NAME=value"))?;
                Ok(format!("{name}={}", unquote(value)))
            })
            .collect(),
    }
}
