//! The shipped operator holds only the product: its command lists no
//! developer tooling, and neither the test kit nor the developer tooling (nor
//! the mock's code generator) is in its dependency tree. Needs only Rust.

use std::collections::BTreeSet;
use std::process::Command;

use anyhow::Context as _;

/// The subcommands `bucketmap --help` lists.
fn listed_commands() -> anyhow::Result<BTreeSet<String>> {
    let out = Command::new(env!("CARGO_BIN_EXE_bucketmap"))
        .arg("--help")
        .output()
        .context("cannot run bucketmap --help")?;
    anyhow::ensure!(out.status.success(), "bucketmap --help failed: {out:?}");
    let help = String::from_utf8(out.stdout)?;
    let commands = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    Ok(commands)
}

#[test]
fn the_operator_binary_lists_no_developer_command() -> anyhow::Result<()> {
    let commands = listed_commands()?;
    let expected: BTreeSet<String> = ["operator", "crd", "help"].map(String::from).into();
    assert_eq!(commands, expected);
    Ok(())
}

/// The crates `package` builds with (normal and build dependencies),
/// resolved for it alone, as the image and `cargo dev` build it.
fn tree(package: &str) -> anyhow::Result<BTreeSet<String>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(&cargo)
        .args(["tree", "--offline", "--locked", "-p", package])
        .args(["-e", "normal,build", "--prefix", "none", "--format", "{p}"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .context("cannot run cargo tree")?;
    anyhow::ensure!(out.status.success(), "cargo tree -p {package}: {out:?}");
    Ok(String::from_utf8(out.stdout)?
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect())
}

#[test]
fn the_product_depends_on_no_test_kit_or_developer_tooling() -> anyhow::Result<()> {
    for product in ["bucketmap", "bucketmap-sidecar"] {
        let crates = tree(product)?;
        assert!(crates.contains(product), "{product}: {crates:?}");
        for scaffolding in [
            "bucketmap-testkit",
            "bucketmap-devtools",
            "tonic-build",
            "proptest",
        ] {
            assert!(
                !crates.contains(scaffolding),
                "{product} depends on {scaffolding}"
            );
        }
    }
    Ok(())
}

/// The Dockerfile's lines and those of the scripts it runs (`bash tools/…`),
/// comments left out.
fn image_build_commands() -> anyhow::Result<String> {
    let root = env!("CARGO_MANIFEST_DIR");
    let dockerfile = std::fs::read_to_string(format!("{root}/Dockerfile"))?;
    let mut commands = String::new();
    for line in dockerfile
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
    {
        commands.push_str(line);
        commands.push('\n');
        for script in line.split_whitespace().filter(|w| w.starts_with("tools/")) {
            let text = std::fs::read_to_string(format!("{root}/{script}"))
                .with_context(|| format!("the Dockerfile runs {script}"))?;
            let code = text.lines().filter(|l| !l.trim_start().starts_with('#'));
            commands.extend(code.map(|l| format!("{l}\n")));
        }
    }
    Ok(commands)
}

#[test]
fn the_image_builds_only_the_two_product_packages_each_on_its_own() -> anyhow::Result<()> {
    let commands = image_build_commands()?;
    let builds: Vec<&str> = commands
        .lines()
        .filter(|l| l.contains("cargo build") || l.contains("cargo install"))
        .collect();
    let mut packages = BTreeSet::new();
    for build in &builds {
        let words: Vec<&str> = build.split_whitespace().collect();
        let named: Vec<&str> = words
            .windows(2)
            .filter(|w| w[0] == "-p" || w[0] == "--package")
            .map(|w| w[1])
            .collect();
        // Built together, Cargo would unify the two packages' dependency
        // features: the sidecar would carry what only the operator needs.
        assert_eq!(named.len(), 1, "one package per build: {build}");
        assert!(
            !words.contains(&"--workspace") && !words.contains(&"--all"),
            "{words:?}"
        );
        packages.extend(named);
    }
    assert_eq!(packages, BTreeSet::from(["bucketmap", "bucketmap-sidecar"]));
    Ok(())
}

/// The operator, the sidecar and the embedded default each link ring and
/// no second crypto library: aws-lc would be built from C for nothing (the
/// longest build of a first `cargo dev`) and make both binaries larger.
#[test]
fn every_product_links_one_crypto_library() -> anyhow::Result<()> {
    for package in ["bucketmap", "bucketmap-sidecar", "bucketmap-devtools"] {
        let crates = tree(package)?;
        assert!(crates.contains("ring"), "{package}: {crates:?}");
        for second in ["aws-lc-rs", "aws-lc-sys", "openssl-sys"] {
            assert!(!crates.contains(second), "{package} links {second}");
        }
    }
    Ok(())
}

#[test]
fn the_image_ships_the_sidecar_built_to_abort_on_a_panic_and_with_its_profile() -> anyhow::Result<()>
{
    let root = env!("CARGO_MANIFEST_DIR");
    let dockerfile = std::fs::read_to_string(format!("{root}/Dockerfile"))?;
    let build = dockerfile
        .lines()
        .find(|l| l.contains("tools/pgo/build.sh") && !l.trim_start().starts_with('#'))
        .context("the Dockerfile does not build the sidecar with tools/pgo/build.sh")?;
    // Its own command, not in a pipeline: /bin/sh has no pipefail, and a
    // failed build must fail the image build.
    assert!(
        build.contains("&& bash tools/pgo/build.sh > /tmp/shipped-sidecar"),
        "{build}"
    );
    assert!(
        dockerfile.contains("cp target/dist/bucketmap \"$(tail -n 1 /tmp/shipped-sidecar)\" /out/"),
        "the image copies another build of the sidecar"
    );
    assert!(
        !dockerfile.contains("-p bucketmap-sidecar"),
        "the Dockerfile builds the sidecar a second way"
    );
    let script = std::fs::read_to_string(format!("{root}/tools/pgo/build.sh"))?;
    let cargo = script
        .lines()
        .find(|l| l.contains("cargo build") && !l.trim_start().starts_with('#'))
        .context("tools/pgo/build.sh runs no cargo build")?;
    assert!(cargo.contains("--profile dist-sidecar"), "{cargo}");
    assert!(cargo.contains("-p bucketmap-sidecar"), "{cargo}");
    assert!(
        script.contains("packed=\"$root/tools/pgo/sidecar.profdata.xz\"")
            && script.contains("-Cprofile-use=$profile"),
        "tools/pgo/build.sh does not build with the committed profile"
    );
    // The committed profile: xz around an indexed LLVM profile (what
    // `llvm-profdata merge` writes).
    let packed = format!("{root}/tools/pgo/sidecar.profdata.xz");
    assert!(
        std::fs::read(&packed)?.starts_with(b"\xfd7zXZ\x00"),
        "{packed} is not xz"
    );
    let profile = std::process::Command::new("xz")
        .args(["-dc", &packed])
        .output()?;
    assert!(profile.status.success(), "xz -dc {packed} failed");
    assert!(
        profile.stdout.starts_with(b"\xfflprofi\x81"),
        "{packed} does not hold an indexed LLVM profile"
    );
    let manifest = std::fs::read_to_string(format!("{root}/Cargo.toml"))?;
    let profile: Vec<&str> = manifest
        .lines()
        .skip_while(|l| l.trim() != "[profile.dist-sidecar]")
        .skip(1)
        .take_while(|l| !l.starts_with('['))
        .map(str::trim)
        .collect();
    assert!(profile.contains(&"inherits = \"dist\""), "{profile:?}");
    assert!(profile.contains(&"panic = \"abort\""), "{profile:?}");
    Ok(())
}

/// The image the node tests run is assembled without Docker
/// (`bucketmap_testkit::images`): it must be the image the Dockerfile
/// describes. The final stage is read here line by line, on its own, and
/// compared with what the assembler builds, copies and configures.
#[test]
fn the_assembled_image_is_the_one_the_dockerfile_describes() -> anyhow::Result<()> {
    use bucketmap_testkit::images::{dockerfile::FinalStage, product};
    let root = env!("CARGO_MANIFEST_DIR");
    let dockerfile = std::fs::read_to_string(format!("{root}/Dockerfile"))?;
    let code: Vec<&str> = dockerfile
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect();
    let last_from = code
        .iter()
        .rposition(|l| l.starts_with("FROM "))
        .context("no FROM")?;
    let stage = &code[last_from..];
    let value = |keyword: &str| -> Vec<&str> {
        stage
            .iter()
            .filter_map(|l| l.strip_prefix(keyword))
            .map(str::trim)
            .collect()
    };
    for build in [
        product::OPERATOR_BUILD.join(" "),
        product::SIDECAR_BUILD.join(" "),
    ] {
        assert!(
            code.iter().any(|l| l.contains(&build)),
            "the Dockerfile no longer runs {build}"
        );
    }

    let assembled = FinalStage::of_repository()?;
    let config = product::product_run_config(&assembled);
    assert_eq!(value("USER "), [config.user.as_str()]);
    let entrypoint: Vec<String> = serde_json::from_str(value("ENTRYPOINT ").concat().as_str())?;
    assert_eq!(entrypoint, config.entrypoint);
    let env = value("ENV ");
    assert!(!env.is_empty(), "the final stage sets no ENV");
    assert_eq!(
        config.env[config.env.len() - env.len()..],
        env,
        "{config:?}"
    );

    let [copy] = value("COPY ")[..] else {
        panic!("expected one COPY in the final stage: {stage:?}")
    };
    let words: Vec<&str> = copy
        .split_whitespace()
        .filter(|w| !w.starts_with("--"))
        .collect();
    let (dest, sources) = words.split_last().context("COPY without a destination")?;
    let expected: BTreeSet<(String, String)> = sources
        .iter()
        .map(|s| {
            let name = s.rsplit('/').next().unwrap_or(s);
            (name.to_owned(), format!("{dest}{name}"))
        })
        .collect();
    let destinations = product::binary_destinations(&assembled)?;
    assert_eq!(destinations.into_iter().collect::<BTreeSet<_>>(), expected);
    assert_eq!(expected.len(), 2, "{expected:?}");
    Ok(())
}

/// Every stage of the Dockerfile starts from an image pinned by a sha256
/// digest (a tag can be moved to other bytes, a digest cannot), the final
/// one from the base the node tests' image assembler imitates.
#[test]
fn every_base_image_is_pinned_by_digest() -> anyhow::Result<()> {
    use bucketmap_testkit::images::{dockerfile, product};
    let path = bucketmap_testkit::repo_path("Dockerfile");
    let text = std::fs::read_to_string(&path)?;
    let froms = dockerfile::from_args(&text);
    anyhow::ensure!(
        froms.len() >= 2,
        "expected a build and a final stage: {froms:?}"
    );
    for from in &froms {
        let (name, digest) = dockerfile::image_reference(from);
        let hex = digest
            .and_then(|d| d.strip_prefix("sha256:"))
            .unwrap_or_default();
        anyhow::ensure!(
            hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
            "FROM {name} is not pinned by a sha256 digest ({from})"
        );
        anyhow::ensure!(
            name.contains(':'),
            "FROM {name} names no tag for the reader"
        );
    }
    let last = froms.last().map(|from| dockerfile::image_reference(from).0);
    assert_eq!(last, Some(product::DISTROLESS_BASE));
    Ok(())
}

/// The release workflow, parsed.
fn release_workflow() -> anyhow::Result<serde_yaml::Value> {
    let path = bucketmap_testkit::repo_path(".github/workflows/release.yml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    Ok(serde_yaml::from_str(&text)?)
}

#[test]
fn the_release_publishes_for_both_platforms_the_image_the_chart_pulls() -> anyhow::Result<()> {
    let workflow = release_workflow()?;
    let values: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(
        bucketmap_testkit::repo_path("deploy/chart/bucketmap/values.yaml"),
    )?)?;
    let image = workflow["env"]["IMAGE"].as_str().context("env.IMAGE")?;
    assert_eq!(values["image"]["repository"].as_str(), Some(image));
    assert_eq!(
        values["sidecar"]["image"]["repository"].as_str(),
        Some(image)
    );
    let job = &workflow["jobs"]["image"];
    let platforms: Vec<&str> = (job["strategy"]["matrix"]["include"].as_sequence())
        .context("a platform matrix")?
        .iter()
        .filter_map(|p| p["platform"].as_str())
        .collect();
    assert_eq!(platforms, ["linux/amd64", "linux/arm64"]);
    let steps = job["steps"].as_sequence().context("steps")?;
    let build = steps.iter().find(|s| s["id"].as_str() == Some("build"));
    let with = &build.context("a build step")?["with"];
    assert_eq!(with["file"].as_str(), Some("Dockerfile"));
    assert_eq!(with["sbom"].as_bool(), Some(true));
    Ok(())
}

/// Every action a workflow uses is pinned by a full commit hash, with the
/// release it is in named in a comment: a tag can be moved to other code,
/// a commit cannot.
#[test]
fn workflows_pin_every_action_by_commit() -> anyhow::Result<()> {
    let dir = bucketmap_testkit::repo_path(".github/workflows");
    let mut pinned = 0;
    for entry in std::fs::read_dir(&dir).with_context(|| format!("read {}", dir.display()))? {
        let path = entry?.path();
        let text = std::fs::read_to_string(&path)?;
        for (number, line) in text.lines().enumerate() {
            let Some((_, used)) = line.split_once("uses:") else {
                continue;
            };
            let at = format!("{}:{}", path.display(), number + 1);
            let (action, comment) = used.split_once('#').unwrap_or((used, ""));
            let commit = action.trim().rsplit_once('@').map_or("", |(_, rev)| rev);
            let hex = commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit());
            anyhow::ensure!(hex, "{at}: {} is not pinned by commit", action.trim());
            let release = comment.trim();
            anyhow::ensure!(
                release.starts_with('v') && release[1..].split('.').count() == 3,
                "{at}: {} names no release (# vX.Y.Z)",
                action.trim()
            );
            pinned += 1;
        }
    }
    anyhow::ensure!(pinned > 0, "no action found under {}", dir.display());
    Ok(())
}

#[test]
fn the_release_refuses_a_tag_of_another_version() -> anyhow::Result<()> {
    let script = bucketmap_testkit::repo_path("tools/release/check-version.sh");
    let run = |tag: &str| Command::new("bash").arg(&script).arg(tag).output();
    let version = env!("CARGO_PKG_VERSION");
    let ok = run(&format!("v{version}"))?;
    assert!(ok.status.success(), "{ok:?}");
    assert_eq!(String::from_utf8(ok.stdout)?.trim(), version);
    let other = run("v99.0.0")?;
    assert!(!other.status.success(), "{other:?}");
    let why = String::from_utf8(other.stderr)?;
    assert!(why.contains("versions differ: tag 99.0.0"), "{why}");
    Ok(())
}

#[test]
fn the_released_chart_pulls_both_images_by_the_released_digest() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let values = dir.path().join("values.yaml");
    std::fs::copy(
        bucketmap_testkit::repo_path("deploy/chart/bucketmap/values.yaml"),
        &values,
    )?;
    let script = bucketmap_testkit::repo_path("tools/release/pin-digest.sh");
    let digest = format!("sha256:{}", "ab".repeat(32));
    let out = Command::new("bash")
        .arg(&script)
        .arg(&values)
        .arg(&digest)
        .output()?;
    assert!(out.status.success(), "{out:?}");
    let pinned: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(&values)?)?;
    assert_eq!(pinned["image"]["digest"].as_str(), Some(digest.as_str()));
    assert_eq!(
        pinned["sidecar"]["image"]["digest"].as_str(),
        Some(digest.as_str())
    );
    let pin = |digest: &str| {
        Command::new("bash")
            .arg(&script)
            .arg(&values)
            .arg(digest)
            .output()
    };
    let before = std::fs::read_to_string(&values)?;
    assert!(
        pin(&digest)?.status.success(),
        "pinning again changes nothing"
    );
    assert_eq!(std::fs::read_to_string(&values)?, before);
    // Another digest cannot pin both any more: refused, not half done.
    let other = pin(&format!("sha256:{}", "cd".repeat(32)))?;
    assert!(!other.status.success(), "{other:?}");
    assert!(String::from_utf8(other.stderr)?.contains("expected 2 image digests"));
    assert!(!pin("latest")?.status.success(), "a tag is no digest");
    Ok(())
}
