//! The cluster's certificate authority, as pure functions over PEM text: create the CA, make a
//! key and a signing request, sign a request for a subject *we* choose (only the public key is
//! taken from the request), and read back who a presented certificate names.
//!
//! Every certificate names its holder in one URI SAN, `spiffe://gpumesh/node/<id>` or
//! `spiffe://gpumesh/client/<name>`; agents' certificates also carry the DNS name
//! [`SERVER_NAME`], which is what every client verifies (addresses change, the name does not).

use std::time::{Duration, SystemTime};

use gpu_raft_store::NodeId;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use sha2::{Digest, Sha256};

pub use gpu_proto::TLS_SERVER_NAME as SERVER_NAME;
const URI_PREFIX: &str = "spiffe://gpumesh/";

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("certificate error: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("not a valid certificate: {0}")]
    Parse(String),
    #[error("{0}")]
    Invalid(String),
}

/// Who a certificate speaks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subject {
    Node(NodeId),
    Client(String),
}

impl Subject {
    fn uri(&self) -> String {
        match self {
            Subject::Node(id) => format!("{URI_PREFIX}node/{id}"),
            Subject::Client(name) => format!("{URI_PREFIX}client/{name}"),
        }
    }

    fn parse_uri(uri: &str) -> Option<Self> {
        let rest = uri.strip_prefix(URI_PREFIX)?;
        if let Some(id) = rest.strip_prefix("node/") {
            return id.parse().ok().filter(|id| *id > 0).map(Subject::Node);
        }
        let name = rest.strip_prefix("client/")?;
        (!name.is_empty()).then(|| Subject::Client(name.to_owned()))
    }
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Subject::Node(id) => write!(f, "node {id}"),
            Subject::Client(name) => write!(f, "client {name}"),
        }
    }
}

/// A certificate with its private key, both PEM.
#[derive(Clone)]
pub struct KeyedCert {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for KeyedCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedCert").finish_non_exhaustive()
    }
}

/// What a presented certificate says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertInfo {
    pub subject: Subject,
    /// Hex of the serial number: what revocation names.
    pub serial: String,
    pub not_after: SystemTime,
}

/// A new self-signed cluster CA. Its name carries the day it was made, so that the CAs
/// trusted side by side during a rotation have names of their own.
pub fn new_ca(now: SystemTime, validity: Duration) -> Result<KeyedCert, PkiError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    let made = time::OffsetDateTime::from(now);
    // The key id's first 8 hex digits (`signature::key_id`).
    let tag = hex::encode(&Sha256::digest(key.public_key_raw())[..4]);
    params.distinguished_name = name(&format!(
        "gpumesh cluster CA {}-{:02}-{:02} {tag}",
        made.year(),
        u8::from(made.month()),
        made.day()
    ));
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    set_validity(&mut params, now, validity);
    params.serial_number = Some(random_serial());
    let cert = params.self_signed(&key)?;
    Ok(KeyedCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// A fresh private key and a signing request for it (the key never leaves its holder).
pub fn new_request() -> Result<(String, String), PkiError> {
    let key = KeyPair::generate()?;
    let csr = CertificateParams::default().serialize_request(&key)?;
    Ok((key.serialize_pem(), csr.pem()?))
}

/// Sign `csr_pem` for `subject`. Names, usages and lifetime come from us, not from the request.
pub fn sign(
    ca: &KeyedCert,
    csr_pem: &str,
    subject: &Subject,
    now: SystemTime,
    validity: Duration,
) -> Result<String, PkiError> {
    let csr = CertificateSigningRequestParams::from_pem(csr_pem)
        .map_err(|e| PkiError::Invalid(format!("bad certificate signing request: {e}")))?;
    let issuer = issuer(ca)?;
    Ok(leaf_params(subject, now, validity)?
        .signed_by(&csr.public_key, &issuer)?
        .pem())
}

/// A key and certificate for `subject`, made in one place (bootstrap, `dev`, admin clients).
pub fn issue(
    ca: &KeyedCert,
    subject: &Subject,
    now: SystemTime,
    validity: Duration,
) -> Result<KeyedCert, PkiError> {
    let (key_pem, csr_pem) = new_request()?;
    Ok(KeyedCert {
        cert_pem: sign(ca, &csr_pem, subject, now, validity)?,
        key_pem,
    })
}

/// Read the subject, serial and expiry of a DER certificate.
pub fn inspect(der: &[u8]) -> Result<CertInfo, PkiError> {
    use x509_parser::prelude::*;
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| PkiError::Parse(e.to_string()))?;
    let subject = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .into_iter()
        .flat_map(|san| san.value.general_names.iter())
        .find_map(|n| match n {
            GeneralName::URI(uri) => Subject::parse_uri(uri),
            _ => None,
        })
        .ok_or_else(|| PkiError::Invalid("certificate names no gpumesh node or client".into()))?;
    let not_after = u64::try_from(cert.validity().not_after.timestamp())
        .map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s))
        .unwrap_or(SystemTime::UNIX_EPOCH);
    Ok(CertInfo {
        subject,
        serial: hex::encode(cert.raw_serial()),
        not_after,
    })
}

/// `inspect` for the first certificate in a PEM text.
pub fn inspect_pem(pem: &str) -> Result<CertInfo, PkiError> {
    inspect(&first_der(pem)?)
}

/// Whether the CA of `ca_pem` signed the certificate `cert_pem`.
pub fn issued_by(cert_pem: &str, ca_pem: &str) -> bool {
    use x509_parser::prelude::*;
    let (Ok(cert), Ok(ca)) = (first_der(cert_pem), first_der(ca_pem)) else {
        return false;
    };
    match (
        X509Certificate::from_der(&cert),
        X509Certificate::from_der(&ca),
    ) {
        (Ok((_, cert)), Ok((_, ca))) => cert.verify_signature(Some(ca.public_key())).is_ok(),
        _ => false,
    }
}

/// A CA certificate's common name and expiry.
pub fn describe_ca(cert_pem: &str) -> Result<(String, SystemTime), PkiError> {
    use x509_parser::prelude::*;
    let der = first_der(cert_pem)?;
    let (_, cert) = X509Certificate::from_der(&der).map_err(|e| PkiError::Parse(e.to_string()))?;
    let name = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_owned();
    let not_after = u64::try_from(cert.validity().not_after.timestamp())
        .map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s))
        .unwrap_or(SystemTime::UNIX_EPOCH);
    Ok((name, not_after))
}

/// Whether `key_pem` is the private key of the certificate `cert_pem` (a CA key handed to a
/// new signer is checked before it is kept).
pub fn key_matches(cert_pem: &str, key_pem: &str) -> bool {
    use x509_parser::prelude::*;
    let Ok(key) = KeyPair::from_pem(key_pem) else {
        return false;
    };
    let Ok(der) = first_der(cert_pem) else {
        return false;
    };
    X509Certificate::from_der(&der).is_ok_and(|(_, cert)| {
        cert.public_key().subject_public_key.data.as_ref() == key.public_key_raw()
    })
}

/// SHA-256 of a certificate's DER, hex: how operators pin a CA.
pub fn fingerprint(pem: &str) -> Result<String, PkiError> {
    Ok(hex::encode(Sha256::digest(first_der(pem)?)))
}

/// Each certificate of a PEM bundle (a trust bundle holds one CA, or two while the CA is
/// rotated), as PEM text of its own.
pub fn certs_in(bundle: &str) -> Vec<String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut certs = Vec::new();
    let mut rest = bundle;
    while let Some(start) = rest.find(BEGIN) {
        let Some(len) = rest[start..].find(END) else {
            break;
        };
        let end = start + len + END.len();
        certs.push(format!("{}\n", &rest[start..end]));
        rest = &rest[end..];
    }
    certs
}

fn first_der(pem: &str) -> Result<Vec<u8>, PkiError> {
    let (_, parsed) = x509_parser::pem::parse_x509_pem(pem.as_bytes())
        .map_err(|e| PkiError::Parse(e.to_string()))?;
    Ok(parsed.contents)
}

fn issuer(ca: &KeyedCert) -> Result<Issuer<'static, KeyPair>, PkiError> {
    let key = KeyPair::from_pem(&ca.key_pem)?;
    Ok(Issuer::from_ca_cert_pem(&ca.cert_pem, key)?)
}

fn leaf_params(
    subject: &Subject,
    now: SystemTime,
    validity: Duration,
) -> Result<CertificateParams, PkiError> {
    let mut params = CertificateParams::default();
    params.distinguished_name = name(&subject.to_string());
    params.subject_alt_names = vec![SanType::URI(subject.uri().try_into()?)];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    if let Subject::Node(_) = subject {
        params
            .subject_alt_names
            .push(SanType::DnsName(SERVER_NAME.try_into()?));
        params
            .extended_key_usages
            .push(ExtendedKeyUsagePurpose::ServerAuth);
    }
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(random_serial());
    set_validity(&mut params, now, validity);
    Ok(params)
}

fn name(common: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "gpumesh");
    dn.push(DnType::CommonName, common);
    dn
}

/// Valid from a minute ago (clock skew between hosts) for `validity`.
fn set_validity(params: &mut CertificateParams, now: SystemTime, validity: Duration) {
    let secs = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    };
    let to_time = |s: u64| {
        time::OffsetDateTime::from_unix_timestamp(i64::try_from(s).unwrap_or(i64::MAX))
            .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
    };
    params.not_before = to_time(secs(now).saturating_sub(60));
    params.not_after = to_time(secs(now + validity));
}

/// 16 random bytes, high bit clear (a positive DER integer).
fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    SerialNumber::from_slice(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn a_signed_request_names_the_subject_we_chose() {
        let now = SystemTime::now();
        let ca = new_ca(now, 365 * DAY).expect("ca");
        let (_key, csr) = new_request().expect("csr");
        let cert = sign(&ca, &csr, &Subject::Node(7), now, DAY).expect("sign");
        let info = inspect_pem(&cert).expect("inspect");
        assert_eq!(info.subject, Subject::Node(7));
        assert_eq!(info.serial.len(), 32);
        let left = info.not_after.duration_since(now).expect("expires later");
        assert!(left > DAY - Duration::from_secs(5) && left <= DAY);

        let client = issue(&ca, &Subject::Client("alice".into()), now, DAY).expect("client");
        assert_eq!(
            inspect_pem(&client.cert_pem).expect("inspect").subject,
            Subject::Client("alice".into())
        );
        assert_ne!(
            inspect_pem(&client.cert_pem).expect("inspect").serial,
            info.serial
        );
    }

    #[test]
    fn only_the_cas_own_key_matches_it() {
        let now = SystemTime::now();
        let ca = new_ca(now, DAY).expect("ca");
        let other = new_ca(now, DAY).expect("another ca");
        assert!(key_matches(&ca.cert_pem, &ca.key_pem));
        assert!(!key_matches(&ca.cert_pem, &other.key_pem));
        assert!(!key_matches(&ca.cert_pem, "not a key"));
    }

    #[test]
    fn garbage_is_refused_with_a_reason() {
        let now = SystemTime::now();
        let ca = new_ca(now, DAY).expect("ca");
        let err = sign(&ca, "not a csr", &Subject::Node(1), now, DAY).expect_err("garbage");
        assert!(err.to_string().contains("signing request"), "{err}");
        assert!(inspect(b"\x30\x03junk").is_err());
        // The CA itself names no node or client: it cannot be used as an identity.
        assert!(inspect_pem(&ca.cert_pem).is_err());
        assert_eq!(fingerprint(&ca.cert_pem).expect("fp").len(), 64);
    }

    #[test]
    fn subjects_round_trip_through_their_uri() {
        for s in [
            Subject::Node(1),
            Subject::Node(u64::MAX),
            Subject::Client("ops-1".into()),
        ] {
            assert_eq!(Subject::parse_uri(&s.uri()), Some(s));
        }
        for bad in [
            "spiffe://gpumesh/node/0",
            "spiffe://gpumesh/node/x",
            "spiffe://gpumesh/client/",
            "spiffe://other/node/1",
        ] {
            assert_eq!(Subject::parse_uri(bad), None, "{bad}");
        }
    }
}
