import { fromBinary, isFieldSet, toBinary } from '@bufbuild/protobuf';
import { FieldDescriptorProtoSchema, FileDescriptorProtoSchema, type DescriptorProto, type FieldDescriptorProto, type FileDescriptorProto } from '@bufbuild/protobuf/wkt';
import { loadSync, type PackageDefinition } from '@grpc/proto-loader';
import { protoPath as healthProtoPath } from 'grpc-health-check';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);

/** The protos of the services grpc-js serves beside ours: health checking and reflection itself (v1 and v1alpha). */
export const INFRASTRUCTURE_PROTOS: readonly string[] = [
  healthProtoPath,
  require.resolve('@grpc/reflection/build/proto/grpc/reflection/v1/reflection.proto'),
  require.resolve('@grpc/reflection/build/proto/grpc/reflection/v1alpha/reflection.proto'),
];

/**
 * The package definition to hand `@grpc/reflection`: our protos (relative to `protoDir`) plus grpc.health.v1 and
 * the reflection protos, so `list` names every service the server answers, with descriptors a reflection client
 * can link on its own.
 *
 * Why not proto-loader's output as is: it emits one file per package (`rollout_v1.proto`, `google_protobuf.proto`)
 * whose `dependency` lists are empty and whose type names are relative (grpc/grpc-node#2595, #2958), so strict
 * clients (grpcurl, Go's protodesc) fail with `"*.google.protobuf.Struct" not found`. Here every file lists the
 * files it references and every type name is fully qualified, as protoc writes them; map entry types and proto3
 * `optional` fields are repaired too (see below). Field names stay as in the .proto (keepCase).
 */
export function reflectedDefinition(protoFiles: readonly string[], protoDir: string): PackageDefinition {
  const definition = loadSync([...protoFiles, ...INFRASTRUCTURE_PROTOS], { includeDirs: [protoDir], keepCase: true });
  // proto-loader gives every entry of one load the same file list: link each distinct list once.
  const linked = new Map<readonly Uint8Array[], Buffer[]>();
  for (const entry of Object.values(definition)) {
    if (!('fileDescriptorProtos' in entry) || !Array.isArray(entry.fileDescriptorProtos)) continue;
    const files = entry.fileDescriptorProtos as readonly Uint8Array[];
    let fixed = linked.get(files);
    if (fixed === undefined) {
      fixed = linkFiles(files.map((bytes) => fromBinary(FileDescriptorProtoSchema, bytes))).map((file) => Buffer.from(toBinary(FileDescriptorProtoSchema, file)));
      linked.set(files, fixed);
    }
    entry.fileDescriptorProtos = fixed;
  }
  return definition;
}

/** Resolves every type reference to a fully-qualified name and records the file defining it as a dependency. */
function linkFiles(files: FileDescriptorProto[]): FileDescriptorProto[] {
  const owner = new Map<string, string>(); // fully-qualified type name (no leading dot) → file name
  for (const file of files) {
    for (const [name, message] of messages(file)) {
      nameMapEntries(message);
      markProto3Optionals(message);
      owner.set(name, file.name);
    }
  }
  for (const file of files) {
    for (const e of file.enumType) owner.set(join(file.package, e.name), file.name);
    for (const [name, message] of messages(file)) {
      for (const e of message.enumType) owner.set(join(name, e.name), file.name);
    }
  }
  const resolve = (ref: string, scope: string): string => {
    if (ref.startsWith('.')) return ref.slice(1);
    for (let at = scope; at !== ''; at = parentScope(at)) {
      if (owner.has(`${at}.${ref}`)) return `${at}.${ref}`;
    }
    return ref;
  };
  return files.map((file) => {
    const dependencies = new Set<string>();
    const link = (ref: string, scope: string): string => {
      const fqn = resolve(ref, scope);
      const defining = owner.get(fqn);
      if (defining === undefined) throw new Error(`reflection: ${file.name} references unknown type ${ref}`);
      if (defining !== file.name) dependencies.add(defining);
      return `.${fqn}`;
    };
    // Only assign names that are set: descriptor.proto is proto2, so assigning '' would mark an unset field set.
    const linkField = (field: FieldDescriptorProto, scope: string): void => {
      if (field.typeName !== '') field.typeName = link(field.typeName, scope);
      if (field.extendee !== '') field.extendee = link(field.extendee, scope);
    };
    for (const [name, message] of messages(file)) {
      for (const field of [...message.field, ...message.extension]) linkField(field, name);
    }
    for (const field of file.extension) linkField(field, file.package);
    for (const service of file.service) {
      for (const method of service.method) {
        method.inputType = link(method.inputType, file.package);
        method.outputType = link(method.outputType, file.package);
      }
    }
    file.dependency = [...dependencies].sort();
    return file;
  });
}

/** protobufjs names a map field's entry type `<Field>`; protoc (and Go's protodesc, strictly) wants `<Field>Entry`. */
function nameMapEntries(message: DescriptorProto): void {
  for (const field of message.field) {
    const entry = message.nestedType.find((nested) => nested.options?.mapEntry === true && nested.name === field.typeName);
    if (entry === undefined) continue;
    entry.name = mapEntryName(field.name);
    field.typeName = entry.name;
  }
}

/**
 * protobufjs writes `optional x` as a plain oneof `_x` holding only x and drops the proto3_optional flag; protoc
 * flags the field and puts such synthetic oneofs after the real ones (Go's protodesc insists on both).
 */
function markProto3Optionals(message: DescriptorProto): void {
  const inOneof = message.field.filter((field) => isFieldSet(field, FieldDescriptorProtoSchema.field.oneofIndex));
  const synthetic = message.oneofDecl.map((oneof, i) => {
    const members = inOneof.filter((field) => field.oneofIndex === i);
    return members.length === 1 && oneof.name === `_${members[0]!.name}`;
  });
  const order = [...message.oneofDecl.keys()].sort((a, b) => Number(synthetic[a]) - Number(synthetic[b]) || a - b);
  for (const field of inOneof) {
    if (synthetic[field.oneofIndex]) field.proto3Optional = true;
    field.oneofIndex = order.indexOf(field.oneofIndex);
  }
  message.oneofDecl = order.map((i) => message.oneofDecl[i]!);
}

/** protoc's rule: `reward_details` → `RewardDetailsEntry`. */
function mapEntryName(fieldName: string): string {
  return `${fieldName.replace(/(?:^|_)(.)/g, (_, c: string) => c.toUpperCase())}Entry`;
}

/** Every message of a file with its fully-qualified name, nested ones included (parents first). */
function* messages(file: FileDescriptorProto): Generator<[string, DescriptorProto]> {
  const walk = function* (message: DescriptorProto, scope: string): Generator<[string, DescriptorProto]> {
    const fqn = join(scope, message.name);
    yield [fqn, message];
    for (const nested of message.nestedType) yield* walk(nested, fqn);
  };
  for (const message of file.messageType) yield* walk(message, file.package);
}

const join = (scope: string, name: string): string => (scope === '' ? name : `${scope}.${name}`);
const parentScope = (scope: string): string => scope.slice(0, Math.max(0, scope.lastIndexOf('.')));
