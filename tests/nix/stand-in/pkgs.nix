# What gptforge's flake.nix takes from nixpkgs, and nothing else: a missing attribute is an
# evaluation error. Its derivations are real (they have drvPaths, fixed-output hashes are checked)
# but are never built. buildFHSEnv rejects every argument name that nixpkgs' buildFHSEnv does not
# name (buildfhsenv-args.toml, with its sources) and returns what the real one returns: the wrapper
# package, with `env` for interactive shells and `args` as passed.
{ system }:
let
  inherit (builtins)
    attrNames
    concatStringsSep
    elem
    filter
    fromTOML
    readFile
    removeAttrs
    ;

  accepted = map (a: a.name) (fromTOML (readFile ./buildfhsenv-args.toml)).arguments;

  neverBuilt = attrs: derivation ({ inherit system; builder = "/stand-in/never-built"; } // attrs);

  pkgs = {
    # nixpkgs/lib/licenses.nix and lib/source-types.nix, the two entries used
    lib.licenses.bsd3 = {
      spdxId = "BSD-3-Clause";
      free = true;
    };
    lib.sourceTypes.binaryNativeCode = {
      shortName = "binaryNativeCode";
      isSource = false;
    };

    # The host's bash: tests run the flake's shell snippets as they stand. In nixpkgs, a store path.
    runtimeShell = "bash";

    git = neverBuilt { name = "git"; };
    cacert = neverBuilt { name = "cacert"; };
    gcc = neverBuilt { name = "gcc-wrapper"; };

    fetchurl =
      { url, sha256 }:
      neverBuilt {
        name = baseNameOf url;
        inherit url;
        outputHashMode = "flat";
        outputHashAlgo = "sha256";
        outputHash = sha256;
      };

    stdenvNoCC.mkDerivation =
      attrs:
      neverBuilt (removeAttrs attrs [ "meta" ] // { name = "${attrs.pname}-${attrs.version}"; })
      // {
        meta = attrs.meta or { };
      };

    buildFHSEnv =
      args:
      let
        unknown = filter (n: !elem n accepted) (attrNames args);
        name = args.name or "${args.pname}-${args.version}";
        # what reaches the bubblewrap command line, as the real one splices it
        bwrap = concatStringsSep "\n" ([ (args.extraPreBwrapCmds or "") ] ++ args.extraBwrapArgs or [ ]);
        rootfs = neverBuilt {
          name = "${name}-fhsenv-rootfs";
          paths = (args.targetPkgs or (_: [ ])) pkgs;
          profile = args.profile or "";
        };
      in
      if unknown != [ ] then
        throw "buildFHSEnv takes no argument named ${concatStringsSep ", " unknown} (nixpkgs' names: tests/nix/stand-in/buildfhsenv-args.toml)"
      else
        neverBuilt {
          inherit name rootfs bwrap;
          runScript = args.runScript or "bash";
        }
        // {
          env = neverBuilt {
            name = "${name}-shell-env";
            shellHook = bwrap;
            inherit rootfs;
          };
          inherit args;
          meta.mainProgram = args.executableName or args.pname or name;
        };
  };
in
pkgs
