package envd

// File types in EntryInfo.Type (filesystem.proto FileType).
const (
	FileTypeFile      = "FILE_TYPE_FILE"
	FileTypeDirectory = "FILE_TYPE_DIRECTORY"
	FileTypeSymlink   = "FILE_TYPE_SYMLINK"
)

// Messages of envd's filesystem service (filesystem.proto) and of the
// /files routes.
type (
	// EntryInfo describes one file or directory.
	EntryInfo struct {
		Name          string  `json:"name"`
		Type          string  `json:"type"`
		Path          string  `json:"path"`
		Size          int64   `json:"size"`
		Mode          uint32  `json:"mode"`
		Permissions   string  `json:"permissions"`
		Owner         string  `json:"owner"`
		Group         string  `json:"group"`
		ModifiedTime  string  `json:"modifiedTime,omitempty"`
		SymlinkTarget *string `json:"symlinkTarget,omitempty"`
		// Metadata is what the X-Metadata-* headers of the file's last
		// upload set.
		Metadata map[string]string `json:"metadata,omitempty"`
	}
	// PathRequest is the request of Stat, MakeDir and Remove.
	PathRequest struct {
		Path string `json:"path"`
	}
	// EntryResponse is the reply of Stat, MakeDir and Move.
	EntryResponse struct {
		Entry EntryInfo `json:"entry"`
	}
	// ListDirRequest lists Path to Depth levels (0 is read as 1).
	ListDirRequest struct {
		Path  string `json:"path"`
		Depth Uint   `json:"depth"`
	}
	// ListDirResponse is ListDir's reply.
	ListDirResponse struct {
		Entries []EntryInfo `json:"entries"`
	}
	// MoveRequest renames Source to Destination.
	MoveRequest struct {
		Source      string `json:"source"`
		Destination string `json:"destination"`
	}
	// WriteInfo is one element of POST /files's reply (a JSON array).
	WriteInfo struct {
		Name     string            `json:"name"`
		Type     string            `json:"type"`
		Path     string            `json:"path"`
		Metadata map[string]string `json:"metadata,omitempty"`
	}
)

// Event types in FilesystemEvent.Type (filesystem.proto EventType).
const (
	EventTypeCreate = "EVENT_TYPE_CREATE"
	EventTypeWrite  = "EVENT_TYPE_WRITE"
	EventTypeRemove = "EVENT_TYPE_REMOVE"
	EventTypeRename = "EVENT_TYPE_RENAME"
	EventTypeChmod  = "EVENT_TYPE_CHMOD"
)

// Messages of ProcedureWatchDir.
type (
	// WatchDirRequest watches Path (and its subdirectories when
	// Recursive); IncludeEntry adds each event's entry info.
	WatchDirRequest struct {
		Path         string `json:"path"`
		Recursive    bool   `json:"recursive"`
		IncludeEntry bool   `json:"includeEntry"`
	}
	// WatchDirResponse is one message of the stream: start first, then
	// filesystem events and keepalives.
	WatchDirResponse struct {
		Start      *struct{}        `json:"start,omitempty"`
		Filesystem *FilesystemEvent `json:"filesystem,omitempty"`
		Keepalive  *struct{}        `json:"keepalive,omitempty"`
	}
	// FilesystemEvent is one change: Name is the path relative to the
	// watched directory, Type one of the EventType constants.
	FilesystemEvent struct {
		Name  string     `json:"name"`
		Type  string     `json:"type"`
		Entry *EntryInfo `json:"entry,omitempty"`
	}
)
