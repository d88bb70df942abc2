package pluginsandbox

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
)

// maxSkillFileBytes caps a file ReadSkill returns.
const maxSkillFileBytes = 1 << 20

// ListSkills lists the skills of the loaded skill bundles.
func (s *Server) ListSkills(context.Context, *pluginv1.ListSkillsRequest) (*pluginv1.ListSkillsResponse, error) {
	c := s.current()
	resp := &pluginv1.ListSkillsResponse{}
	for _, id := range c.skillIDs {
		sk := c.skills[id]
		resp.Skills = append(resp.Skills, &pluginv1.Skill{Id: sk.ID, Plugin: sk.Plugin, Name: sk.Name, Description: sk.Description})
	}
	return resp, nil
}

// ReadSkill returns SKILL.md of a loaded skill, or the file at path inside
// the skill's folder. The path is checked component by component: no
// "..", no absolute path, no symbolic link, a regular file of at most
// 1 MiB, with the digest the load checked.
func (s *Server) ReadSkill(_ context.Context, req *pluginv1.ReadSkillRequest) (*pluginv1.ReadSkillResponse, error) {
	if _, _, ok := manifest.ParseSkillID(req.GetId()); !ok {
		return nil, rpcerr.Error(codes.InvalidArgument, rpcerr.ReasonInvalid, rpcerr.NoIndex, "`id` must be plugin:<plugin>/<skill>")
	}
	sk, ok := s.current().skills[req.GetId()]
	if !ok {
		return nil, rpcerr.Error(codes.NotFound, rpcerr.ReasonNotFound, rpcerr.NoIndex, fmt.Sprintf("Unknown skill `%s`", req.GetId()))
	}
	rel := req.GetPath()
	if rel == "" {
		rel = manifest.SkillFile
	}
	if strings.ContainsAny(rel, "\\\x00") || path.IsAbs(rel) || path.Clean(rel) != rel || !filepath.IsLocal(filepath.FromSlash(rel)) {
		return nil, rpcerr.Error(codes.InvalidArgument, rpcerr.ReasonInvalid, rpcerr.NoIndex, "`path` must be a relative path inside the skill's folder")
	}
	cur := sk.Dir
	for _, seg := range strings.Split(rel, "/") {
		cur = filepath.Join(cur, seg)
		fi, err := os.Lstat(cur)
		if err != nil {
			return nil, rpcerr.Error(codes.NotFound, rpcerr.ReasonNotFound, rpcerr.NoIndex, fmt.Sprintf("No file `%s` in skill `%s`", rel, sk.ID))
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			return nil, rpcerr.Error(codes.InvalidArgument, rpcerr.ReasonInvalid, rpcerr.NoIndex, "skill files may not be symbolic links")
		}
	}
	fi, err := os.Lstat(cur)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() > maxSkillFileBytes {
		return nil, rpcerr.Error(codes.InvalidArgument, rpcerr.ReasonInvalid, rpcerr.NoIndex, fmt.Sprintf("`%s` is not a regular file of at most %d bytes", rel, maxSkillFileBytes))
	}
	data, err := os.ReadFile(cur)
	if err != nil {
		return nil, rpcerr.Error(codes.Unavailable, rpcerr.ReasonCapacity, rpcerr.NoIndex, "skill file unreadable")
	}
	// Only the bytes the load checked (against skills_sha256, which a
	// signature covers) are served: a file changed or added since is
	// refused until the next scan has checked it, rather than served in
	// a signed plugin's name.
	if want, ok := sk.Files[manifest.SkillFileOf(sk, rel)]; !ok || sha256.Sum256(data) != want {
		return nil, rpcerr.Error(codes.FailedPrecondition, rpcerr.ReasonInvalid, rpcerr.NoIndex,
			fmt.Sprintf("`%s` of skill `%s` changed since the plugin was loaded; the next scan checks it again", rel, sk.ID))
	}
	// The answer carries text: a file that is not UTF-8 (an image among
	// a skill's references) failed the call as an internal error.
	if !utf8.Valid(data) {
		return nil, rpcerr.Error(codes.InvalidArgument, rpcerr.ReasonInvalid, rpcerr.NoIndex, fmt.Sprintf("`%s` is not UTF-8 text", rel))
	}
	return &pluginv1.ReadSkillResponse{Id: sk.ID, Path: rel, Content: string(data)}, nil
}
