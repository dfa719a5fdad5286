package tumbler

// Plaintext transport credentials. grpc-go 1.33 (what Debian ships) has no
// credentials/insecure package and its only plaintext option,
// grpc.WithInsecure, is deprecated in later releases; this small
// implementation works with both.

import (
	"context"
	"net"

	"google.golang.org/grpc/credentials"
)

type insecureCreds struct{}

type insecureInfo struct{ credentials.CommonAuthInfo }

func (insecureInfo) AuthType() string { return "insecure" }

// Insecure returns credentials for a plaintext connection (the default of Dial).
func Insecure() credentials.TransportCredentials { return insecureCreds{} }

func (insecureCreds) ClientHandshake(_ context.Context, _ string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return conn, insecureInfo{credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
}

func (insecureCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return conn, insecureInfo{credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
}

func (insecureCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "insecure"}
}
func (insecureCreds) Clone() credentials.TransportCredentials { return insecureCreds{} }
func (insecureCreds) OverrideServerName(string) error         { return nil }
