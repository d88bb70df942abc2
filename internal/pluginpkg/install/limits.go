package install

// Limits bound what an install may read and write. Zero fields take the
// defaults.
type Limits struct {
	// IndexBytes caps a registry index; default 4 MiB.
	IndexBytes int64
	// DownloadBytes caps a downloaded archive, enforced while streaming;
	// default 64 MiB.
	DownloadBytes int64
	// ExpandedBytes caps the bytes an archive extracts to, counted as they
	// are written (the sizes a zip header claims are not trusted), and the
	// bytes a local install copies; default 256 MiB.
	ExpandedBytes int64
	// Entries caps the files and folders of an archive or a copied
	// directory; default 10000.
	Entries int
}

func (l Limits) withDefaults() Limits {
	if l.IndexBytes <= 0 {
		l.IndexBytes = 4 << 20
	}
	if l.DownloadBytes <= 0 {
		l.DownloadBytes = 64 << 20
	}
	if l.ExpandedBytes <= 0 {
		l.ExpandedBytes = 256 << 20
	}
	if l.Entries <= 0 {
		l.Entries = 10000
	}
	return l
}
