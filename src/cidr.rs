//! IP ranges of a bucket's IP filter: GCS takes only a range whose host
//! bits are zero (`192.0.2.0/24`, not `192.0.2.1/24`), and at most 200 of
//! them. The CRD's CEL checks the notation; these checks, beyond the CEL of
//! the oldest Kubernetes the chart admits (1.29), run in the admission
//! webhook so that `kubectl apply` says so at once.

use std::net::IpAddr;

use crate::crd::GcsSpec;

/// Why `range` (CIDR notation) is not a range GCS accepts, if it is not.
pub fn range_problem(range: &str) -> Option<String> {
    let parsed = range.split_once('/').and_then(|(address, prefix)| {
        Some((address.parse::<IpAddr>().ok()?, prefix.parse::<u32>().ok()?))
    });
    let Some((address, prefix)) = parsed else {
        return Some(format!(
            "ipFilter range {range:?} is not in CIDR notation (ADDRESS/PREFIX)"
        ));
    };
    let network = match address {
        IpAddr::V4(a) if prefix <= 32 => {
            let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
            IpAddr::from((u32::from(a) & mask).to_be_bytes())
        }
        IpAddr::V6(a) if prefix <= 128 => {
            let mask = u128::MAX.checked_shl(128 - prefix).unwrap_or(0);
            IpAddr::from((u128::from(a) & mask).to_be_bytes())
        }
        _ => return Some(format!("ipFilter range {range:?} has a prefix too long")),
    };
    (network != address).then(|| {
        format!(
            "ipFilter range {range} has host bits set: GCS accepts only the network address, {network}/{prefix}"
        )
    })
}

/// GCS's limit on the ranges of one IP filter, public and VPC together.
pub const MAX_RANGES: usize = 200;

/// The first problem among the ranges of `spec.ipFilter`, if any: too
/// many (a sum CEL cannot bound on Kubernetes 1.29), or one GCS refuses.
pub fn ip_filter_problem(spec: &GcsSpec) -> Option<String> {
    let filter = spec.ip_filter.as_ref()?;
    let public = filter.public_network_source.iter();
    let vpcs = filter.vpc_network_sources.iter().flatten();
    let mut ranges = public
        .flat_map(|p| &p.allowed_ip_cidr_ranges)
        .chain(vpcs.flat_map(|v| &v.allowed_ip_cidr_ranges));
    let count = ranges.clone().count();
    if count > MAX_RANGES {
        return Some(format!(
            "ipFilter allows at most {MAX_RANGES} IP ranges in all, public and VPC together (a GCS limit); this one has {count}"
        ));
    }
    ranges.find_map(|r| range_problem(r))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_network_addresses_pass() {
        for ok in [
            "10.0.0.0/8",
            "0.0.0.0/0",
            "192.0.2.7/32",
            "2001:db8::/32",
            "::/0",
        ] {
            assert_eq!(range_problem(ok), None, "{ok}");
        }
        let cases = [
            ("10.0.0.1/8", "10.0.0.0/8"),
            ("192.0.2.1/24", "192.0.2.0/24"),
            ("2001:db8::1/32", "2001:db8::/32"),
        ];
        for (bad, network) in cases {
            let problem = range_problem(bad).unwrap_or_default();
            assert!(
                problem.contains("host bits set") && problem.ends_with(network),
                "{problem}"
            );
        }
        for malformed in [
            "10.0.0.0",
            "10.0.0.0/33",
            "example.com/8",
            "::/129",
            "10.0.0.0/x",
        ] {
            assert!(range_problem(malformed).is_some(), "{malformed}");
        }
    }

    #[test]
    fn every_range_of_the_filter_is_checked() {
        let spec = |vpc_range: &str| -> GcsSpec {
            serde_json::from_value(serde_json::json!({"bucketName": "photos", "ipFilter": {
                "mode": "Enabled",
                "publicNetworkSource": {"allowedIpCidrRanges": ["203.0.113.0/24"]},
                "vpcNetworkSources": [{"network": "projects/p/global/networks/n",
                                       "allowedIpCidrRanges": ["10.8.0.0/14", vpc_range]}]}}))
            .expect("a valid spec")
        };
        assert_eq!(ip_filter_problem(&spec("10.4.0.0/14")), None);
        let problem = ip_filter_problem(&spec("10.4.0.1/14")).unwrap_or_default();
        assert!(problem.contains("10.4.0.1/14"), "{problem}");
    }

    #[test]
    fn at_most_200_ranges_public_and_vpc_together() {
        let ranges = |n: usize, from: usize| -> Vec<String> {
            (from..from + n)
                .map(|i| format!("10.{}.{}.0/24", i / 256, i % 256))
                .collect()
        };
        let spec = |public: usize, vpc: usize| -> GcsSpec {
            serde_json::from_value(serde_json::json!({"bucketName": "photos", "ipFilter": {
                "mode": "Enabled",
                "publicNetworkSource": {"allowedIpCidrRanges": ranges(public, 0)},
                "vpcNetworkSources": [{"network": "projects/p/global/networks/n",
                                       "allowedIpCidrRanges": ranges(vpc, public)}]}}))
            .expect("a valid spec")
        };
        assert_eq!(ip_filter_problem(&spec(100, 100)), None);
        let problem = ip_filter_problem(&spec(101, 100)).unwrap_or_default();
        assert!(
            problem.contains("at most 200") && problem.ends_with("has 201"),
            "{problem}"
        );
    }
}
